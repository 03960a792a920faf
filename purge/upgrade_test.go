package purge_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// earlierSchema is the MariaDB table of the releases whose claim left
// processed_at to the column's default, as their CreateSchema made it,
// with processed_at's default given: theirs, UTC_TIMESTAMP(6), or a
// hand-made table's CURRENT_TIMESTAMP(6), which their inbox check passed
// (it compared the type only).
func earlierSchema(def string) string {
	return "CREATE TABLE IF NOT EXISTS %[1]s (\n" +
		"\tconsumer     VARBINARY(255) NOT NULL,\n" +
		"\tevent_id     VARBINARY(255) NOT NULL,\n" +
		"\tprocessed_at DATETIME(6) NOT NULL DEFAULT " + def + ",\n" +
		"\tPRIMARY KEY (consumer, event_id),\n" +
		"\tKEY `%[1]s_processed_at_idx` (processed_at)\n" +
		") ENGINE=InnoDB"
}

// earlierClaim is those releases' claim.
const earlierClaim = "INSERT INTO %s (consumer, event_id) VALUES (?, ?) ON DUPLICATE KEY UPDATE processed_at = processed_at"

// claimedEarlier is a claim an earlier release made from a session at
// zone, age ago by the database clock, and whether a purge with a 24-hour
// retention deletes it.
type claimedEarlier struct {
	id, zone string
	age      time.Duration
	gone     bool
}

// claimEarlier makes c in table as an earlier release did, in a session
// at c.zone whose clock is set c.age back (SET timestamp moves NOW(),
// CURRENT_TIMESTAMP and UTC_TIMESTAMP alike).
func claimEarlier(t *testing.T, pools map[string]*sql.DB, table string, c claimedEarlier) {
	t.Helper()
	ctx := context.Background()
	conn, err := pools[c.zone].Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "SET timestamp = @@timestamp - ?", c.age.Seconds())
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, fmt.Sprintf(earlierClaim, table), "billing", c.id)
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "SET timestamp = DEFAULT")
	require.NoError(t, err)
}

// An upgrade never purges a live claim. Rows claimed by an earlier
// release from sessions at -12:59 (MariaDB's westmost), -08:00, UTC and
// +13:00 into a table whose processed_at defaults to CURRENT_TIMESTAMP(6)
// hold the writers' local times; purged with a 24-hour retention from a
// session at UTC and at +13:00 (MariaDB's eastmost; the purge compares
// with UTC_TIMESTAMP, which no session zone moves), no claim younger than
// the retention goes, and the purge keeps 14 hours past it: the -08:00
// claim 17 hours old, which looks 25 hours old, was deleted, and a copy
// arriving within 7 hours ran its handler again. Rows older than the
// retention plus 14 hours plus the writer's offset east of UTC go. The
// earlier release's own table (UTC_TIMESTAMP(6)) purges as it did. Each
// round says so once in the log, and inbox check warns.
func TestUpgradeNeverPurgesLiveClaims(t *testing.T) {
	t.Parallel()
	local := []claimedEarlier{
		{id: "west-17h", zone: "-08:00", age: 17 * time.Hour},
		{id: "west-23h", zone: "-08:00", age: 23 * time.Hour},
		{id: "westmost-23h", zone: "-12:59", age: 23 * time.Hour},
		{id: "east-23h", zone: "+13:00", age: 23 * time.Hour},
		{id: "utc-23h", zone: "+00:00", age: 23 * time.Hour},
		{id: "west-39h", zone: "-08:00", age: 39 * time.Hour, gone: true},
		{id: "westmost-39h", zone: "-12:59", age: 39 * time.Hour, gone: true},
		{id: "utc-39h", zone: "+00:00", age: 39 * time.Hour, gone: true},
		// Looks 26 hours old: a writer east of UTC made it look younger.
		{id: "east-39h", zone: "+13:00", age: 39 * time.Hour},
		{id: "east-52h", zone: "+13:00", age: 52 * time.Hour, gone: true},
	}
	utc := []claimedEarlier{
		{id: "west-23h", zone: "-08:00", age: 23 * time.Hour},
		{id: "east-23h", zone: "+13:00", age: 23 * time.Hour},
		{id: "west-25h", zone: "-08:00", age: 25 * time.Hour, gone: true},
		{id: "east-25h", zone: "+13:00", age: 25 * time.Hour, gone: true},
	}
	pools := map[string]*sql.DB{}
	for _, zone := range []string{"-12:59", "-08:00", "+00:00", "+13:00"} {
		pools[zone] = mysqlAt(t, zone)
	}
	for _, c := range []struct {
		name, def string
		claims    []claimedEarlier
		margin    bool
	}{
		{"CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP(6)", local, true},
		{"UTC_TIMESTAMP", "(UTC_TIMESTAMP(6))", utc, false},
	} {
		for _, purger := range []string{"+00:00", "+13:00"} {
			t.Run(c.name+"/purge at "+purger, func(t *testing.T) {
				t.Parallel()
				admin := pools["+00:00"]
				table := testdb.Table(t, admin, "purge_upgrade")
				_, err := admin.Exec(fmt.Sprintf(earlierSchema(c.def), table))
				require.NoError(t, err)
				for _, claim := range c.claims {
					claimEarlier(t, pools, table, claim)
				}
				store, err := sqlinbox.New(mysqlAt(t, purger), sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: table})
				require.NoError(t, err)
				// The upgraded release's claim, from a session west of UTC.
				upgraded, err := sqlinbox.New(pools["-08:00"], sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: table})
				require.NoError(t, err)
				migrate := ""
				if c.margin {
					migrate = fmt.Sprintf("ALTER TABLE `%s` MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))", table)
				}
				requireUpgradePurge(t, &bundle{tg: mysqlTarget, db: admin, store: store, table: table}, upgraded, c.claims, "current_timestamp(6)", migrate)
			})
		}
	}
}

// requireUpgradePurge claims an event through upgraded, the release that
// writes processed_at itself, then purges b's table with a 24-hour
// retention twice, and checks that exactly the claims marked gone went,
// in the first round, and that the purge's log and inbox check said, once,
// that the default def writes local times and how to migrate; or nothing
// when migrate is "".
func requireUpgradePurge(t *testing.T, b *bundle, upgraded purge.Store, claims []claimedEarlier, def, migrate string) {
	t.Helper()
	ctx := context.Background()
	require.True(t, (&bundle{tg: b.tg, db: b.db, store: upgraded.(*sqlinbox.Store), table: b.table}).claim(t, "billing", "upgraded"))
	want := map[string]int64{}
	for _, claim := range claims {
		if claim.gone {
			want["billing"]++
		}
	}
	logs := watermill.NewCaptureLogger()
	p, err := purge.New(b.store, purge.Config{Retention: 24 * time.Hour, BatchPause: time.Millisecond, Logger: logs})
	require.NoError(t, err)
	counts, err := p.DryRun(ctx)
	require.NoError(t, err)
	require.Equal(t, want, counts)
	for round := range 2 {
		n, err := p.PurgeOnce(ctx)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, want["billing"]*int64(1-round), n, "round %d", round)
	}
	for _, claim := range claims {
		require.Equal(t, !claim.gone, b.has(t, "billing", claim.id), "%s claimed %s ago at %s", claim.id, claim.age, claim.zone)
	}
	require.True(t, b.has(t, "billing", "upgraded"))

	var said []string
	for _, l := range logs.Captured()[watermill.InfoLogLevel] {
		if l.Msg == "Inbox purge keeps rows 14h past the retention: processed_at's default writes local times" {
			said = append(said, l.Fields["reason"].(string))
		}
	}
	check, err := b.store.Maintenance().Check(ctx, 0)
	require.NoError(t, err)
	var warned []maintenance.Finding
	for _, f := range check.Findings {
		require.True(t, f.OK, "%+v", f)
		if f.Warning != "" {
			warned = append(warned, f)
		}
	}
	if migrate == "" {
		require.Empty(t, said)
		require.Empty(t, warned)
		return
	}
	require.Len(t, said, 1, "once, not once per round")
	require.Contains(t, said[0], "processed_at defaults to "+def+", the writer's session time")
	require.Contains(t, said[0], migrate)
	require.Len(t, warned, 1)
	require.Equal(t, maintenance.AspectTimeDefault, warned[0].Aspect)
	require.Equal(t, def, warned[0].Found)
	require.Contains(t, warned[0].Warning, migrate)
}

// The same upgrade on PostgreSQL. The schema's timestamptz DEFAULT now()
// holds the instant whatever the writer's TimeZone: its earlier claims
// purge as they did. A hand-made DEFAULT (now() AT TIME ZONE 'UTC') holds
// the UTC wall clock read in the writer's zone, so a claim from a session
// east of UTC looks older by the offset (Asia/Tokyo 9 h, Pacific/Kiritimati
// 14 h, zones without daylight saving so the offsets hold on any date):
// the purge deleted a 10-hour-old claim from Kiritimati with a 24-hour
// retention. The purge, from sessions at UTC and at +14:00, keeps such a
// table's rows 14 hours past the retention.
func TestUpgradeNeverPurgesLiveClaimsPostgreSQL(t *testing.T) {
	t.Parallel()
	const tokyo, kiritimati, west = "Asia/Tokyo", "Pacific/Kiritimati", "Etc/GMT+8"
	local := []claimedEarlier{
		{id: "kiritimati-10h", zone: kiritimati, age: 10 * time.Hour},
		{id: "kiritimati-23h", zone: kiritimati, age: 23 * time.Hour},
		{id: "tokyo-17h", zone: tokyo, age: 17 * time.Hour},
		{id: "west-23h", zone: west, age: 23 * time.Hour},
		{id: "kiritimati-25h", zone: kiritimati, age: 25 * time.Hour, gone: true},
		{id: "tokyo-30h", zone: tokyo, age: 30 * time.Hour, gone: true},
		{id: "utc-39h", zone: "UTC", age: 39 * time.Hour, gone: true},
		// Looks 31 hours old: a writer west of UTC made it look younger.
		{id: "west-39h", zone: west, age: 39 * time.Hour},
		{id: "west-47h", zone: west, age: 47 * time.Hour, gone: true},
	}
	schemas := []claimedEarlier{
		{id: "kiritimati-23h", zone: kiritimati, age: 23 * time.Hour},
		{id: "west-23h", zone: west, age: 23 * time.Hour},
		{id: "kiritimati-25h", zone: kiritimati, age: 25 * time.Hour, gone: true},
		{id: "west-25h", zone: west, age: 25 * time.Hour, gone: true},
	}
	pools := map[string]*sql.DB{}
	for _, zone := range []string{tokyo, kiritimati, west, "UTC"} {
		pools[zone] = testdb.Open(t, "pgx", pgAt(zone))
	}
	for _, c := range []struct {
		name, def string
		claims    []claimedEarlier
	}{
		{"now() AT TIME ZONE 'UTC'", "(now() AT TIME ZONE 'UTC'::text)", local},
		{"now()", "", schemas},
	} {
		for _, purger := range []string{"UTC", kiritimati} {
			t.Run(c.name+"/purge at "+purger, func(t *testing.T) {
				t.Parallel()
				admin := pools["UTC"]
				table := testdb.Table(t, admin, "purge_upgrade")
				config := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table}
				store, err := sqlinbox.New(testdb.Open(t, "pgx", pgAt(purger)), config)
				require.NoError(t, err)
				require.NoError(t, store.CreateSchema(context.Background()))
				migrate := ""
				if c.def != "" {
					_, err = admin.Exec(fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN processed_at SET DEFAULT (now() AT TIME ZONE 'UTC')`, table))
					require.NoError(t, err)
					migrate = fmt.Sprintf(`ALTER TABLE "%s" ALTER COLUMN processed_at SET DEFAULT now()`, table)
				}
				for _, claim := range c.claims {
					// The earlier releases' claim left processed_at to
					// the default; the row is then dated back by its age,
					// which keeps the writer's offset in it.
					_, err := pools[claim.zone].Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, table), "billing", claim.id)
					require.NoError(t, err)
					_, err = admin.Exec(fmt.Sprintf(`UPDATE %s SET processed_at = processed_at - make_interval(secs => $1) WHERE event_id = $2`, table), claim.age.Seconds(), claim.id)
					require.NoError(t, err)
				}
				upgraded, err := sqlinbox.New(pools[kiritimati], config)
				require.NoError(t, err)
				requireUpgradePurge(t, &bundle{tg: postgres, db: admin, store: store, table: table}, upgraded, c.claims, c.def, migrate)
			})
		}
	}
}

// On a PostgreSQL table partitioned by processed_at whose default writes
// local times, a partition is dropped only once its end is older than the
// retention plus the margin. The retention is chosen from the database
// clock so that the day before yesterday's partition ends 7 hours past
// the retention's cutoff, whatever the hour: the purge dropped it, with a
// claim that a writer at +14:00 made inside the retention; the day before
// it, 14 hours older still, goes.
func TestUpgradeKeepsPartitionsPastTheMargin(t *testing.T) {
	t.Parallel()
	b := setup(t, postgres, func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Daily })
	testdb.DropTimePartitions(t, b.db, b.table)
	_, err := b.db.Exec(fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN processed_at SET DEFAULT (now() AT TIME ZONE 'UTC')`, b.table))
	require.NoError(t, err)
	since := sinceMidnight(t, b.db)
	older := oldPartition(t, b.db, b.table, since+day+day+time.Hour)
	kept := oldPartition(t, b.db, b.table, since+day+time.Hour)
	// The end of kept is since+day ago; the cutoff 7 hours after it.
	retention := since + day - 7*time.Hour
	b.seed(t, "billing", "older-", 2, since+day+day+time.Hour)
	b.seed(t, "billing", "kept-", 3, since+day+time.Hour)
	require.Equal(t, []string{older, kept}, partitions(t, b.store))

	p := b.purger(t, purge.Config{Retention: retention, AllowShortRetention: true, PartitionsAhead: 1})
	deleted, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, deleted, "the older partition's rows")
	require.Contains(t, partitions(t, b.store), kept)
	require.NotContains(t, partitions(t, b.store), older)
	require.Equal(t, map[string]int64{"billing": 3}, b.rows(t))
}
