package purge_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// shortPurger purges rows older than retention, far below the floor.
func shortPurger(t *testing.T, store purge.Store, retention time.Duration) *purge.Purger {
	t.Helper()
	p, err := purge.New(store, purge.Config{Retention: retention, AllowShortRetention: true, BatchPause: time.Millisecond})
	require.NoError(t, err)
	return p
}

// refused asserts that p refuses the table, in a round and a dry run, and
// returns the round's error.
func refused(t *testing.T, p *purge.Purger) error {
	t.Helper()
	n, err := p.PurgeOnce(context.Background())
	require.ErrorIs(t, err, purge.ErrTableMismatch)
	require.Zero(t, n)
	_, dryErr := p.DryRun(context.Background())
	require.ErrorIs(t, dryErr, purge.ErrTableMismatch)
	return err
}

// SQLite compares processed_at as text, which sorts as time only in the
// form the column's default writes. Rows 90 minutes old written by
// SQLite's datetime('now') ("2026-12-01 10:26:00") or as a Go time.Time
// through modernc ("2026-12-01 10:26:00.283983566 +0000 UTC") sorted
// before the 2-hour cutoff, and a purge deleted them. Now the purge
// refuses the table, deleting nothing, with the statement that converts
// what SQLite can read; once every row is converted it purges exactly the
// expired ones. A row written in another form after the check is never
// deleted.
func TestSQLiteForeignTimeFormats(t *testing.T) {
	t.Parallel()
	b := setup(t, sqliteTarget)
	b.seed(t, "billing", "old-", 3, 3*time.Hour)
	b.seed(t, "billing", "new-", 1, 90*time.Minute)
	insert := fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES (?, ?, %%s)`, b.table)
	_, err := b.db.Exec(fmt.Sprintf(insert, `datetime('now', '-90 minutes')`), "billing", "sqlite-text")
	require.NoError(t, err)
	goTime := time.Now().Add(-90 * time.Minute).UTC()
	_, err = b.db.Exec(fmt.Sprintf(insert, "?"), "billing", "go-time", goTime)
	require.NoError(t, err)

	p := shortPurger(t, b.store, 2*time.Hour)
	err = refused(t, p)
	require.ErrorContains(t, err, "2 rows have a processed_at the purge cannot compare")
	require.ErrorContains(t, err, "UPDATE "+`"`+b.table+`"`+" SET processed_at = strftime('%Y-%m-%dT%H:%M:%fZ', processed_at) WHERE NOT")
	require.Equal(t, map[string]int64{"billing": 6}, b.rows(t), "nothing deleted")

	// The statement the error gives converts what SQLite reads; with a Go
	// time.Time among the rows it fails and changes nothing.
	convert := fmt.Sprintf(`UPDATE %s SET processed_at = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', processed_at) WHERE NOT (typeof(processed_at) = 'text' AND processed_at GLOB '%s')`, b.table, glob)
	_, err = b.db.Exec(convert)
	require.ErrorContains(t, err, "NOT NULL")
	refused(t, p)
	// The program rewrites its own rows, then the statement does the rest.
	_, err = b.db.Exec(fmt.Sprintf(`UPDATE %s SET processed_at = ? WHERE event_id = 'go-time'`, b.table), goTime.Format("2006-01-02T15:04:05.000Z"))
	require.NoError(t, err)
	_, err = b.db.Exec(convert)
	require.NoError(t, err)

	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, n, "the three rows older than the retention, no other")
	for _, id := range []string{"new-1", "sqlite-text", "go-time"} {
		require.True(t, b.has(t, "billing", id), id)
	}

	// Written in another form after the check: compared wrongly, so left
	// alone, even when it is old.
	_, err = b.db.Exec(fmt.Sprintf(insert, `datetime('now', '-3 hours')`), "billing", "late-text")
	require.NoError(t, err)
	n, err = p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	counts, err := p.DryRun(context.Background())
	require.NoError(t, err)
	require.Empty(t, counts)
	require.True(t, b.has(t, "billing", "late-text"))
}

// glob is the form of processed_at SQLite's purge compares.
const glob = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9]Z"

// A MariaDB table made by hand with processed_at TIMESTAMP(6): claims and
// purges ran without complaint, and with the session at time_zone
// '-12:00' a purge with a 1-hour retention deleted a row claimed a moment
// earlier. Now the purge refuses the table, deleting nothing, and says how
// to convert it; converted as it says, the same purger keeps the new claim
// and removes the expired row.
func TestMySQLTimestampColumn(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	cfg.Params = map[string]string{"time_zone": "'-12:00'"}
	db := testdb.Open(t, "mysql", cfg.FormatDSN())
	b := handMade(t, mysqlTarget, db, `CREATE TABLE %s (
	consumer     VARBINARY(255) NOT NULL,
	event_id     VARBINARY(255) NOT NULL,
	processed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	PRIMARY KEY (consumer, event_id),
	KEY (processed_at)
) ENGINE=InnoDB`)
	table := b.table
	p := shortPurger(t, b.store, time.Hour)
	err = refused(t, p)
	require.ErrorContains(t, err, "processed_at is timestamp(6), want datetime(6): the claims write UTC_TIMESTAMP(6), which a TIMESTAMP converts from each writer's session time_zone")
	require.ErrorContains(t, err, "Migrate in a UTC session: SET time_zone = '+00:00'; ALTER TABLE `"+table+"` MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))")
	require.True(t, b.has(t, "billing", "just-now"))

	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	for _, stmt := range []string{"SET time_zone = '+00:00'", "ALTER TABLE `" + table + "` MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))"} {
		_, err = conn.ExecContext(context.Background(), stmt)
		require.NoError(t, err)
	}
	require.NoError(t, conn.Close())
	b.seed(t, "billing", "expired-", 1, 2*time.Hour)
	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.True(t, b.has(t, "billing", "just-now"))
	require.False(t, b.has(t, "billing", "expired-1"))
}

// A PostgreSQL table whose processed_at is a timestamp without time zone
// is refused with the ALTER that converts it.
func TestPostgreSQLTimestampWithoutTimeZone(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	b := handMade(t, postgres, db, `CREATE TABLE %s (consumer text NOT NULL, event_id text NOT NULL,
	processed_at timestamp NOT NULL DEFAULT now(), PRIMARY KEY (consumer, event_id))`)
	table := b.table
	p := shortPurger(t, b.store, time.Hour)
	err := refused(t, p)
	require.ErrorContains(t, err, "processed_at is timestamp without time zone, want timestamp with time zone")
	// The claims wrote the session's local time, in the server's default
	// TimeZone (in the date matrix, 12 hours behind UTC or a zone with DST),
	// which the migration reads them in.
	alter := `ALTER TABLE "` + table + `" ALTER COLUMN processed_at TYPE timestamptz USING processed_at::timestamptz`
	require.ErrorContains(t, err, alter)
	_, err = db.Exec(alter)
	require.NoError(t, err)
	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, b.has(t, "billing", "just-now"))

	// Once the table passes, a purger does not check it again: the check
	// costs one query per purger, not one per round. A new purger (the next
	// cron run, the next deploy) checks afresh.
	_, err = db.Exec(`ALTER TABLE "` + table + `" ALTER COLUMN processed_at TYPE timestamp`)
	require.NoError(t, err)
	_, err = p.PurgeOnce(context.Background())
	require.NoError(t, err, "the purger that passed the check does not run it again")
	require.ErrorContains(t, refused(t, shortPurger(t, b.store, time.Hour)), "processed_at is timestamp without time zone")
}

// handMade creates a table on db with ddl (the table's name in %s), as a
// hand-written schema would, and a store on it holding one claim made just
// now.
func handMade(t *testing.T, tg target, db *sql.DB, ddl string) *bundle {
	t.Helper()
	table := testdb.Table(t, db, "purge_ts")
	_, err := db.Exec(fmt.Sprintf(ddl, table))
	require.NoError(t, err)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: tg.dialect, Table: table})
	require.NoError(t, err)
	b := &bundle{tg: tg, db: db, store: store, table: table}
	require.True(t, b.claim(t, "billing", "just-now"))
	return b
}

var mysqlTarget, sqliteTarget = targets()[1], targets()[2]

// mysqlAt opens the test MariaDB with every session at time_zone zone.
func mysqlAt(t *testing.T, zone string) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	cfg.Params = map[string]string{"time_zone": "'" + zone + "'"}
	return testdb.Open(t, "mysql", cfg.FormatDSN())
}

// pgDomain creates a domain over base, dropped when the test ends.
func pgDomain(t *testing.T, db *sql.DB, base string) string {
	t.Helper()
	name := testdb.Name("purge_ts_domain")
	_, err := db.Exec(fmt.Sprintf(`CREATE DOMAIN %s AS %s`, name, base))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP DOMAIN IF EXISTS ` + name + ` CASCADE`) })
	return name
}

// timeColumnCase is a hand-made table whose processed_at has some type,
// on a database whose sessions have some settings.
type timeColumnCase struct {
	name string
	tg   target
	open func(t *testing.T) *sql.DB
	// column is processed_at's definition; it may name a domain made by
	// domain (%[1]s, and %[2]s for a domain over that domain).
	column string
	domain string
	// refused is what the refusal says, "" when the column is accepted.
	refused string
	// margin is how long past the retention an accepted table's rows stay:
	// 14 h where the default writes the writer's local time.
	margin time.Duration
}

func (c timeColumnCase) table(t *testing.T) *bundle {
	db := c.open(t)
	column := c.column
	if c.domain != "" {
		inner := pgDomain(t, db, c.domain)
		column = fmt.Sprintf(column, inner, pgDomain(t, db, inner))
	}
	ddl := `CREATE TABLE %s (consumer text NOT NULL, event_id text NOT NULL, processed_at ` + column + `, PRIMARY KEY (consumer, event_id))`
	switch c.tg.dialect {
	case sqlinbox.MySQL:
		ddl = "CREATE TABLE %s (consumer VARBINARY(255) NOT NULL, event_id VARBINARY(255) NOT NULL, processed_at " + column + ", PRIMARY KEY (consumer, event_id), KEY (processed_at)) ENGINE=InnoDB"
	case sqlinbox.SQLite:
		ddl = `CREATE TABLE %s (consumer TEXT NOT NULL, event_id TEXT NOT NULL, processed_at ` + column + `, PRIMARY KEY (consumer, event_id)) WITHOUT ROWID`
	}
	return handMade(t, c.tg, db, ddl)
}

func pgPool(t *testing.T) *sql.DB { return testdb.Postgres(t, "pgx") }

func sqlitePool(t *testing.T) *sql.DB { return testdb.SQLite(t) }

// timeColumnCases are the time columns inbox check and the purge judge
// alike (one function decides for both): refused says why a column is
// refused, "" that it is accepted. Accepted: PostgreSQL timestamptz at any
// precision, the default one spelled out, or a domain over it (over
// another); MariaDB DATETIME at any precision, whatever its default and
// the sessions' time_zone (the claims write UTC_TIMESTAMP(6)); SQLite text
// under any declared type, whatever its default (the claims write the
// purge's form). Refused: PostgreSQL timestamp without time zone at any
// precision, or a domain over it; MariaDB TIMESTAMP in any session, UTC
// included (it converts each writer's UTC_TIMESTAMP from the writer's
// time_zone).
func timeColumnCases() []timeColumnCase {
	const pgDefault, sqliteDefault = " NOT NULL DEFAULT now()", " NOT NULL DEFAULT (strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now'))"
	at := func(zone string) func(t *testing.T) *sql.DB {
		return func(t *testing.T) *sql.DB { return mysqlAt(t, zone) }
	}
	return []timeColumnCase{
		{name: "PostgreSQL/timestamptz(3)", tg: postgres, open: pgPool, column: "timestamptz(3)" + pgDefault},
		{name: "PostgreSQL/timestamptz(0)", tg: postgres, open: pgPool, column: "timestamptz(0)" + pgDefault},
		{name: "PostgreSQL/timestamptz(6)", tg: postgres, open: pgPool, column: "timestamptz(6)" + pgDefault},
		{name: "PostgreSQL/timestamp(6) with time zone", tg: postgres, open: pgPool, column: "timestamp(6) with time zone" + pgDefault},
		{name: "PostgreSQL/domain", tg: postgres, open: pgPool, domain: "timestamptz", column: "%[1]s" + pgDefault},
		{name: "PostgreSQL/domain over a domain", tg: postgres, open: pgPool, domain: "timestamptz(3)", column: "%[2]s" + pgDefault},
		{name: "PostgreSQL/timestamptz default in UTC wall time", tg: postgres, open: pgPool, column: "timestamptz NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')", margin: 14 * time.Hour},
		{name: "MariaDB/DATETIME(3) UTC at -12:00", tg: mysqlTarget, open: at("-12:00"), column: "DATETIME(3) NOT NULL DEFAULT (UTC_TIMESTAMP(3))"},
		{name: "MariaDB/DATETIME UTC at -12:00", tg: mysqlTarget, open: at("-12:00"), column: "DATETIME NOT NULL DEFAULT (UTC_TIMESTAMP())"},
		{name: "MariaDB/DATETIME(6) CURRENT_TIMESTAMP at UTC", tg: mysqlTarget, open: at("+00:00"), column: "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)", margin: 14 * time.Hour},
		{name: "MariaDB/DATETIME(6) CURRENT_TIMESTAMP at -12:00", tg: mysqlTarget, open: at("-12:00"), column: "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)", margin: 14 * time.Hour},
		{name: "SQLite/DATETIME", tg: sqliteTarget, open: sqlitePool, column: "DATETIME" + sqliteDefault},
		{name: "SQLite/TIMESTAMP", tg: sqliteTarget, open: sqlitePool, column: "TIMESTAMP" + sqliteDefault},
		{name: "SQLite/TEXT DEFAULT datetime('now')", tg: sqliteTarget, open: sqlitePool, column: "TEXT NOT NULL DEFAULT (datetime('now'))"},

		{name: "PostgreSQL/timestamp", tg: postgres, open: pgPool, column: "timestamp" + pgDefault, refused: "processed_at is timestamp without time zone"},
		{name: "PostgreSQL/timestamp(3)", tg: postgres, open: pgPool, column: "timestamp(3)" + pgDefault, refused: "processed_at is timestamp(3) without time zone"},
		{name: "PostgreSQL/domain over timestamp", tg: postgres, open: pgPool, domain: "timestamp", column: "%[1]s" + pgDefault, refused: "processed_at is timestamp without time zone"},
		{name: "MariaDB/TIMESTAMP(6) at -12:00", tg: mysqlTarget, open: at("-12:00"), column: "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)", refused: "processed_at is timestamp(6), want datetime(6): the claims write UTC_TIMESTAMP(6)"},
		{name: "MariaDB/TIMESTAMP at +13:00", tg: mysqlTarget, open: at("+13:00"), column: "TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP", refused: "processed_at is timestamp, want datetime(6)"},
		{name: "MariaDB/TIMESTAMP(6) at UTC", tg: mysqlTarget, open: at("+00:00"), column: "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)", refused: "processed_at is timestamp(6)"},
		{name: "MariaDB/VARCHAR", tg: mysqlTarget, open: at("+00:00"), column: "VARCHAR(40) NOT NULL DEFAULT ''", refused: "processed_at is varchar(40), want datetime(6)"},
	}
}

// Each time column of timeColumnCases, in a hand-made table holding a claim
// made just now: inbox check's columns finding passes exactly when the
// purge accepts the table. An accepted table's purge deletes the expired
// rows and no other; a refused one's deletes nothing and says why. Each
// accepted type was once refused by one of the two (timestamptz(6) FAILed
// inbox check), and the MariaDB DATETIME written by CURRENT_TIMESTAMP at
// -12:00 was refused while its claims were session-dependent; it now keeps
// a margin (TestUpgradeNeverPurgesLiveClaims).
func TestTableCheckTimeColumns(t *testing.T) {
	t.Parallel()
	for _, c := range timeColumnCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := c.table(t)
			check, err := b.store.Maintenance().Check(context.Background(), 0)
			require.NoError(t, err)
			i := slices.IndexFunc(check.Findings, func(f maintenance.Finding) bool { return f.Aspect == maintenance.AspectColumns })
			require.GreaterOrEqual(t, i, 0)
			require.Equal(t, c.refused == "", check.Findings[i].OK, "inbox check and the purge agree: %+v", check.Findings[i])
			p := shortPurger(t, b.store, time.Hour)
			if c.refused != "" {
				before := b.rows(t)
				require.ErrorContains(t, refused(t, p), c.refused)
				require.Equal(t, before, b.rows(t), "nothing deleted")
				require.True(t, b.has(t, "billing", "just-now"))
				return
			}
			b.seed(t, "billing", "expired-", 3, 3*time.Hour+c.margin)
			b.seed(t, "billing", "live-", 2, 30*time.Minute+c.margin)
			counts, err := p.DryRun(context.Background())
			require.NoError(t, err)
			require.Equal(t, map[string]int64{"billing": 3}, counts)
			n, err := p.PurgeOnce(context.Background())
			require.NoError(t, err)
			require.EqualValues(t, 3, n, "the three rows older than the retention, no other")
			for _, id := range []string{"just-now", "live-1", "live-2"} {
				require.True(t, b.has(t, "billing", id), id)
			}
			require.Equal(t, map[string]int64{"billing": 3}, b.rows(t))
		})
	}
}

// A role that may not read pg_attribute (a catalog hardened by REVOKE ...
// FROM PUBLIC) cannot run the check. It proves nothing wrong, so the purge
// goes on without it rather than stop retention: every round deletes the
// expired rows, 14 hours late in case the default it could not read writes
// local times, and one log line says the check could not run.
func TestTableCheckUnreadableCatalog(t *testing.T) {
	t.Parallel()
	admin := testdb.Postgres(t, "pgx")
	// The REVOKE is the database's own: another database keeps the test
	// database's catalog readable for the other tests.
	dbName, role := testdb.Name("purge_catalog"), testdb.Name("purge_role")
	_, err := admin.Exec(`CREATE DATABASE ` + dbName)
	require.NoError(t, err)
	_, err = admin.Exec(`CREATE ROLE ` + role + ` LOGIN`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.Exec(`DROP DATABASE ` + dbName + ` WITH (FORCE)`)
		require.NoError(t, err)
		_, err = admin.Exec(`DROP ROLE ` + role)
		require.NoError(t, err)
	})
	u, err := url.Parse(testdb.PostgresDSN())
	require.NoError(t, err)
	u.Path = "/" + dbName
	owner := testdb.Open(t, "pgx", u.String())
	table := testdb.Name("purge")
	ownerStore, err := sqlinbox.New(owner, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	require.NoError(t, err)
	require.NoError(t, ownerStore.CreateSchema(context.Background()))
	for _, stmt := range []string{
		`REVOKE SELECT ON pg_catalog.pg_attribute FROM PUBLIC`,
		fmt.Sprintf(`GRANT SELECT, DELETE ON %s TO %s`, table, role),
	} {
		_, err = owner.Exec(stmt)
		require.NoError(t, err)
	}
	u.User = url.User(role)
	db := testdb.Open(t, "pgx", u.String())
	_, err = db.Exec(`SELECT count(*) FROM pg_attribute`)
	require.ErrorContains(t, err, "permission denied", "the role cannot read the catalog")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	require.NoError(t, err)
	b := &bundle{tg: postgres, db: owner, store: ownerStore, table: table}

	logs := watermill.NewCaptureLogger()
	p, err := purge.New(store, purge.Config{Retention: time.Hour, AllowShortRetention: true, BatchPause: time.Millisecond, Logger: logs})
	require.NoError(t, err)
	for round := range 2 {
		// 14 h past the retention: a default this role cannot read may
		// write local times (TestUpgradeNeverPurgesLiveClaimsPostgreSQL).
		b.seed(t, "billing", fmt.Sprintf("expired-%d-", round), 3, 3*time.Hour+14*time.Hour)
		b.seed(t, "billing", fmt.Sprintf("live-%d-", round), 1, 30*time.Minute)
		n, err := p.PurgeOnce(context.Background())
		require.NoError(t, err, "round %d", round)
		require.EqualValues(t, 3, n, "round %d", round)
	}
	require.Equal(t, map[string]int64{"billing": 2}, b.rows(t), "the live rows")
	errs := logs.Captured()[watermill.ErrorLogLevel]
	require.Len(t, errs, 1, "one line, not one per round: %+v", errs)
	require.Equal(t, "Inbox purge cannot check its table's time column; purging without the check", errs[0].Msg)
	require.ErrorContains(t, errs[0].Err, "permission denied for table pg_attribute")
}
