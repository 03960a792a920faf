package sqlinbox_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lib/pq"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// oddTimeZone is 14 hours ahead of UTC: its day starts while UTC's is
// still the day before, so a time read back in the session's zone or as
// the session's DateStyle spells it shows at once.
const oddTimeZone = "Pacific/Kiritimati"

// oddOptions is the startup options of a PostgreSQL session whose times
// and intervals are spelled unlike ISO, with intervalStyle.
func oddOptions(intervalStyle string) string {
	return fmt.Sprintf("-c DateStyle=SQL,DMY -c IntervalStyle=%s -c TimeZone=%s", intervalStyle, oddTimeZone)
}

// oddPostgresDSN is the test DSN with oddOptions, for every connection
// of a pool.
func oddPostgresDSN(intervalStyle string) string {
	sep := "?"
	if strings.Contains(testdb.PostgresDSN(), "?") {
		sep = "&"
	}
	return testdb.PostgresDSN() + sep + "options=" + strings.ReplaceAll(url.QueryEscape(oddOptions(intervalStyle)), "+", "%20")
}

// setDateStyle runs SET DateStyle on each new connection: lib/pq sends
// DateStyle=ISO, MDY in its startup message, which overrides the DSN's
// options, so a lib/pq session gets another DateStyle only this way (a
// connection hook, a pooler's connect_query).
type setDateStyle struct{ driver.Connector }

func (c setDateStyle) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.(driver.ExecerContext).ExecContext(ctx, "SET DateStyle = 'SQL, DMY'", nil); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// oddPostgres opens driverName ("postgres" for lib/pq, "pgx" for pgx's
// stdlib) with the odd settings on every connection, and checks that a
// connection has them.
func oddPostgres(t *testing.T, driverName, intervalStyle string) *sql.DB {
	t.Helper()
	dsn := oddPostgresDSN(intervalStyle)
	var db *sql.DB
	if driverName == "postgres" {
		connector, err := pq.NewConnector(dsn)
		require.NoError(t, err)
		db = sql.OpenDB(setDateStyle{connector})
		t.Cleanup(func() { _ = db.Close() })
	} else {
		db = testdb.Open(t, driverName, dsn)
	}
	requireOddSession(t, db, intervalStyle)
	return db
}

func requireOddSession(t *testing.T, db interface {
	QueryRow(string, ...any) *sql.Row
}, intervalStyle string) {
	t.Helper()
	var dateStyle, style, zone string
	require.NoError(t, db.QueryRow(`SELECT current_setting('DateStyle'), current_setting('IntervalStyle'), current_setting('TimeZone')`).Scan(&dateStyle, &style, &zone))
	require.Equal(t, []string{"SQL, DMY", intervalStyle, oddTimeZone}, []string{dateStyle, style, zone})
}

// sessionStore is what the scenario uses of a store, whichever package
// made it.
type sessionStore interface {
	CreateSchema(ctx context.Context) error
	OldestClaim(ctx context.Context) (time.Time, bool, error)
	Maintenance() maintenance.Store
}

// sessionCase is one store under odd session settings: its middleware,
// and how to insert claims made long ago.
type sessionCase struct {
	store sessionStore
	mw    message.HandlerMiddleware
	// eventTime: the table is partitioned by the time inside event ids,
	// so old claims are claims of old events.
	eventTime bool
	// seedOld inserts claims of ids, processed age ago.
	seedOld func(t *testing.T, ids []string, age time.Duration)
}

// layouts are every PostgreSQL table layout.
var layouts = []struct {
	name string
	mode sqlinbox.Partitioning
	key  sqlinbox.PartitionKey
}{
	{"plain", sqlinbox.NoPartitioning, sqlinbox.ProcessedAt},
	{"daily", sqlinbox.Daily, sqlinbox.ProcessedAt},
	{"monthly", sqlinbox.Monthly, sqlinbox.ProcessedAt},
	{"daily-event-time", sqlinbox.Daily, sqlinbox.EventIDTime},
	{"monthly-event-time", sqlinbox.Monthly, sqlinbox.EventIDTime},
}

// A session whose DateStyle, IntervalStyle and TimeZone are not the
// defaults ("SQL, DMY", sql_standard or postgres_verbose, 14 hours ahead
// of UTC) spells times and intervals unlike ISO. lib/pq reads results as
// text, and on such a session CreateSchema of an existing partitioned
// table failed ("pq: expected end of input, got 50:58.200617 +14"): the
// second start of a service. Every operation of the library works on such
// sessions, through lib/pq, pgx's stdlib and native pgx, on every layout,
// and reads the times right.
func TestOddSessionSettingsPostgreSQL(t *testing.T) {
	t.Parallel()
	for _, style := range []string{"sql_standard", "postgres_verbose"} {
		for _, drv := range []string{"postgres", "pgx", "pgxpool"} {
			for _, l := range layouts {
				t.Run(style+"/"+drv+"/"+l.name, func(t *testing.T) {
					t.Parallel()
					cfg := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: l.mode, PartitionKey: l.key}
					var db *sql.DB
					var store sessionStore
					var mwStore inboxdriver.Store
					if drv == "pgxpool" {
						pc, err := pgxpool.ParseConfig(testdb.PostgresDSN())
						require.NoError(t, err)
						pc.ConnConfig.RuntimeParams["DateStyle"] = "SQL, DMY"
						pc.ConnConfig.RuntimeParams["IntervalStyle"] = style
						pc.ConnConfig.RuntimeParams["TimeZone"] = oddTimeZone
						pool, err := pgxpool.NewWithConfig(context.Background(), pc)
						require.NoError(t, err)
						t.Cleanup(pool.Close)
						db = testdb.Postgres(t, "pgx") // for the test's own statements
						cfg.Table = testdb.Table(t, db, "inbox_odd")
						s, err := pgxinbox.NewStore(pool, cfg)
						require.NoError(t, err)
						t.Cleanup(func() { _ = s.Close() })
						var dateStyle, zone string
						require.NoError(t, pool.QueryRow(context.Background(), `SELECT current_setting('DateStyle'), current_setting('TimeZone')`).Scan(&dateStyle, &zone))
						require.Equal(t, []string{"SQL, DMY", oddTimeZone}, []string{dateStyle, zone})
						store, mwStore = s, s
					} else {
						db = oddPostgres(t, drv, style)
						cfg.Table = testdb.Table(t, db, "inbox_odd")
						s, err := sqlinbox.New(db, cfg)
						require.NoError(t, err)
						t.Cleanup(func() { _ = s.Close() })
						store, mwStore = s, s
					}
					mw, err := inbox.NewMiddleware(inbox.Config{Store: mwStore, Consumer: "billing"})
					require.NoError(t, err)
					table := cfg.Table
					oddSessionScenario(t, sessionCase{
						store: store, mw: mw, eventTime: l.key == sqlinbox.EventIDTime,
						seedOld: func(t *testing.T, ids []string, age time.Duration) {
							_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at)
SELECT 'billing', id, now() - $2::float8 * interval '1 microsecond' FROM unnest($1::text[]) AS id`, table), pq.Array(ids), age.Microseconds())
							require.NoError(t, err)
						},
					})
				})
			}
		}
	}
}

// MariaDB converts TIMESTAMP values and NOW() to each session's
// time_zone; the library's times are DATETIME(6) in UTC, read back as
// text, so a session at -12:00 or +13:00 (MariaDB's widest), with or without parseTime, reads
// them as a UTC session does.
func TestOddSessionSettingsMySQL(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"-12:00", "+13:00"} {
		for _, parseTime := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/parseTime=%v", zone, parseTime), func(t *testing.T) {
				t.Parallel()
				mc, err := mysql.ParseDSN(testdb.MySQLDSN())
				require.NoError(t, err)
				if mc.Params == nil {
					mc.Params = map[string]string{}
				}
				mc.Params["time_zone"] = "'" + zone + "'"
				mc.ParseTime = parseTime
				db := testdb.Open(t, "mysql", mc.FormatDSN())
				var got string
				require.NoError(t, db.QueryRow(`SELECT @@session.time_zone`).Scan(&got))
				require.Equal(t, zone, got)
				table := testdb.Table(t, db, "inbox_odd")
				store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: table})
				require.NoError(t, err)
				t.Cleanup(func() { _ = store.Close() })
				mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "billing"})
				require.NoError(t, err)
				oddSessionScenario(t, sessionCase{
					store: store, mw: mw,
					seedOld: func(t *testing.T, ids []string, age time.Duration) {
						for _, id := range ids {
							_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES ('billing', ?, UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)`, table), id, age.Microseconds())
							require.NoError(t, err)
						}
					},
				})
			})
		}
	}
}

// oddSessionScenario runs, on a store whose sessions have odd settings,
// what a service and its operators do: CreateSchema at two starts, claims
// and a duplicate, the oldest claim, statistics, the table check, a
// listing of claims, a dry run and a purge, a forget, and CreateSchema at
// a third start; it checks the times each returns.
func oddSessionScenario(t *testing.T, c sessionCase) {
	ctx := context.Background()
	m := c.store.Maintenance()
	require.NoError(t, c.store.CreateSchema(ctx), "first start")
	require.NoError(t, c.store.CreateSchema(ctx), "second start")

	// The old claims are dated three days before the current UTC month
	// began, whatever day it is: on a monthly layout a claim of this
	// month sits in the current month's partition, which no purge drops
	// until the month is over, while one dated before the month lies in
	// the default partition, whose expired rows the purge deletes.
	start := testdb.Now()
	y, mo, _ := start.UTC().Date()
	age := start.Sub(time.Date(y, mo, 1, 0, 0, 0, 0, time.UTC)) + 3*day
	near := func(want, got time.Time, what string) {
		t.Helper()
		require.WithinDuration(t, want, got, time.Minute, what)
	}
	calls := map[string]int{}
	h := c.mw(func(msg *message.Message) ([]*message.Message, error) {
		calls[msg.Metadata.Get(inbox.DefaultEventIDMetadataKey)]++
		return nil, nil
	})
	deliver := func(id string) {
		t.Helper()
		_, err := h(eventMsg(id))
		require.NoError(t, err)
	}
	var fresh, old []string
	for i := range 3 {
		fresh = append(fresh, testdb.UUIDv7(start, fmt.Sprintf("fresh-%d", i)))
	}
	for i := range 2 {
		old = append(old, testdb.UUIDv7(start.Add(-age), fmt.Sprintf("old-%d", i)))
	}
	for _, id := range fresh {
		deliver(id)
	}
	deliver(fresh[0])
	require.Equal(t, 1, calls[fresh[0]], "the copy is a duplicate")
	if c.eventTime {
		// Claims of events three days old.
		for _, id := range old {
			deliver(id)
		}
	} else {
		c.seedOld(t, old, age)
	}

	oldest, ok, err := c.store.OldestClaim(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	near(start.Add(-age), oldest, "oldest claim")

	stats, err := m.Stats(ctx)
	require.NoError(t, err)
	near(start, stats.Now, "database clock")
	require.Len(t, stats.Consumers, 1)
	cs := stats.Consumers[0]
	require.Equal(t, "billing", cs.Consumer)
	require.EqualValues(t, 5, cs.Rows)
	near(start, cs.Newest, "newest claim")
	if c.eventTime {
		near(start, cs.Oldest, "oldest processed_at")
		near(start.Add(-age), cs.OldestEvent, "oldest event")
		near(start, cs.NewestEvent, "newest event")
		require.EqualValues(t, 5, cs.LastHour)
	} else {
		near(start.Add(-age), cs.Oldest, "oldest processed_at")
		require.EqualValues(t, 3, cs.LastHour)
		require.EqualValues(t, 3, cs.LastDay)
	}

	check, err := m.Check(ctx, sqlinbox.SchemaPartitionsAhead)
	require.NoError(t, err)
	require.True(t, check.OK(), "%+v", check.Findings)

	claims, err := m.Claims(ctx, maintenance.ClaimFilter{Consumer: "billing", EventIDs: fresh})
	require.NoError(t, err)
	require.Len(t, claims, 3)
	for _, cl := range claims {
		near(start, cl.ProcessedAt, "claim "+cl.EventID)
	}
	between, err := m.Claims(ctx, maintenance.ClaimFilter{Consumer: "billing", From: start.Add(-time.Hour), To: start.Add(time.Hour)})
	require.NoError(t, err)
	if c.eventTime {
		require.Len(t, between, 5)
	} else {
		require.Len(t, between, 3)
	}

	p, err := purge.New(c.store, purge.Config{Retention: day, BatchPause: time.Millisecond})
	require.NoError(t, err)
	counts, err := p.DryRun(ctx)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"billing": 2}, counts)
	n, err := p.PurgeOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "the two claims older than the retention, no other")

	forgotten, err := m.Forget(ctx, "billing", fresh[:1])
	require.NoError(t, err)
	require.Len(t, forgotten, 1)
	near(start, forgotten[0].ProcessedAt, "forgotten claim")
	deliver(fresh[0])
	require.Equal(t, 2, calls[fresh[0]], "forgotten, so processed again")

	consumers, err := m.Consumers(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"billing"}, consumers)
	stats, err = m.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, stats.Consumers[0].Rows)
	require.NoError(t, c.store.CreateSchema(ctx), "third start")
}
