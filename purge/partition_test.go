package purge_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

var postgres = targets()[0]

func partitions(t *testing.T, store *sqlinbox.Store) []string {
	t.Helper()
	sess, busy, err := store.Maintenance().BeginPurge(context.Background())
	require.NoError(t, err)
	require.Nil(t, busy)
	defer sess.Close() //nolint:errcheck // read only
	parts, err := sess.Partitions(context.Background())
	require.NoError(t, err)
	names := []string{}
	for _, p := range parts {
		names = append(names, p.Name)
	}
	return names
}

// dbDay returns the UTC day of the database clock minus ago.
func dbDay(t testing.TB, db *sql.DB, ago time.Duration) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, db.QueryRow(`SELECT date_trunc('day', (now() - $1::float8 * interval '1 microsecond') AT TIME ZONE 'UTC')`, ago.Microseconds()).Scan(&at))
	return at
}

// sinceMidnight is how long ago the database's UTC day began, so that a row
// seeded a fraction of it ago is today's whatever the hour the test runs.
func sinceMidnight(t *testing.T, db *sql.DB) time.Duration {
	t.Helper()
	var us float64
	require.NoError(t, db.QueryRow(`SELECT extract(epoch FROM now() - date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') * 1e6`).Scan(&us))
	return time.Duration(us) * time.Microsecond
}

// oldPartition creates a daily partition in the past, as an earlier round
// would have.
func oldPartition(t *testing.T, db *sql.DB, table string, ago time.Duration) string {
	t.Helper()
	from := dbDay(t, db, ago)
	name := table + "_p" + from.Format("20060102")
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s+00') TO ('%s+00')`,
		name, table, from.Format(time.DateTime), from.AddDate(0, 0, 1).Format(time.DateTime)))
	require.NoError(t, err)
	return name
}

// On a partitioned table a round creates the coming partitions, drops the
// wholly expired ones and deletes expired rows from the default partition;
// partitions holding unexpired rows stay.
func TestPartitionsCreatedAndDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, postgres, func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Daily })
	testdb.DropTimePartitions(t, b.db, b.table) // a table from before CreateSchema made them
	p10 := oldPartition(t, b.db, b.table, 10*day)
	p5 := oldPartition(t, b.db, b.table, 5*day)
	p2 := oldPartition(t, b.db, b.table, 2*day)
	b.seed(t, "billing", "d10-", 100, 10*day)
	b.seed(t, "mailer", "d10-", 20, 10*day)
	b.seed(t, "billing", "d5-", 50, 5*day)
	b.seed(t, "billing", "d2-", 30, 2*day)
	b.seed(t, "billing", "d20-", 7, 20*day)                  // no partition: default
	b.seed(t, "billing", "h1-", 3, sinceMidnight(t, b.db)/2) // today, not created yet: default
	require.Equal(t, []string{p10, p5, p2}, partitions(t, b.store))

	logs := watermill.NewCaptureLogger()
	var batches []int64
	var blocked [][]string
	p := b.purger(t, purge.Config{Retention: 3 * day, PartitionsAhead: 2, Logger: logs, OnBatch: func(n int64) { batches = append(batches, n) },
		OnPartitionsBlocked: func(partitions []string) { blocked = append(blocked, partitions) }})
	counts, err := p.DryRun(context.Background())
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"billing": 157, "mailer": 20}, counts)
	require.Len(t, partitions(t, b.store), 3, "a dry run changes nothing")

	deleted, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 177, deleted)
	// The two dropped partitions, oldest first, then the default
	// partition's expired rows.
	require.Equal(t, []int64{120, 50, 7}, batches)
	require.Equal(t, map[string]int64{"billing": 33}, b.rows(t))
	tomorrow := b.table + "_p" + dbDay(t, b.db, -day).Format("20060102")
	after := b.table + "_p" + dbDay(t, b.db, -2*day).Format("20060102")
	// Today's rows already sit in the default partition, so today cannot
	// get a partition of its own; tomorrow and after can.
	require.Equal(t, []string{p2, tomorrow, after}, partitions(t, b.store))
	today := b.table + "_p" + dbDay(t, b.db, 0).Format("20060102")
	require.Equal(t, [][]string{{today}}, blocked)
	blockedLogs := func(level watermill.LogLevel) int {
		n := 0
		for _, m := range logs.Captured()[level] {
			if m.Fields["partition"] == today && strings.HasPrefix(m.Msg, "Inbox partition") {
				n++
			}
		}
		return n
	}
	require.Equal(t, 1, blockedLogs(watermill.ErrorLogLevel), "a blocked partition is an error the first time")

	// The next round has nothing to do; today is still blocked, said at
	// info level this time.
	deleted, err = p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, deleted)
	require.Equal(t, []string{p2, tomorrow, after}, partitions(t, b.store))
	require.Equal(t, [][]string{{today}, {today}}, blocked)
	require.Equal(t, 1, blockedLogs(watermill.ErrorLogLevel))
	require.Equal(t, 1, blockedLogs(watermill.InfoLogLevel))
}

// Monthly partitions are named by month and start with the current one;
// CreateSchema made it and the next three, a purge round keeping one ahead
// adds none.
func TestMonthlyPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, postgres, func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Monthly })
	p := b.purger(t, purge.Config{Retention: 60 * day, PartitionsAhead: 1})
	_, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	now := dbDay(t, b.db, 0)
	var want []string
	for i := range 4 {
		want = append(want, b.table+"_p"+now.AddDate(0, i, 1-now.Day()).Format("200601"))
	}
	require.Equal(t, want, partitions(t, b.store))
	require.True(t, b.claim(t, "billing", "ev-1"))
	require.False(t, b.claim(t, "billing", "ev-1"))
}

// Dropping a partition needs an exclusive lock on the table. While a long
// transaction holds the table, the drop gives up after LockTimeout (so
// claims do not queue behind it), which is not a failed round (nor an
// event in flight): it is logged, and the next round drops the partition.
func TestDropWaitsAtMostLockTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, postgres, func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Daily })
	old := oldPartition(t, b.db, b.table, 10*day)
	b.seed(t, "billing", "d10-", 10, 10*day)

	// A handler's transaction, still open: its claim holds the table.
	tx, ok, err := claim(context.Background(), b.store, nil, "billing", "in-flight")
	require.NoError(t, err)
	require.True(t, ok)
	t.Cleanup(func() { _ = tx.Rollback() }) // before the table is dropped

	logs := watermill.NewCaptureLogger()
	p := b.purger(t, purge.Config{Retention: 3 * day, LockTimeout: 100 * time.Millisecond, Logger: logs})
	deleted, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.Zero(t, deleted)
	require.True(t, logs.Has(watermill.CapturedMessage{Level: watermill.InfoLogLevel,
		Msg:    "Inbox partition not dropped: the table lock was not granted within LockTimeout (a long transaction holds the table); the next round tries again",
		Fields: watermill.LogFields{"table": b.table, "partition": old, "lock_timeout": "100ms"}}))
	require.Contains(t, partitions(t, b.store), old)
	require.Equal(t, map[string]int64{"billing": 10}, b.rows(t))

	// The same wait reported by the session: its own error, not a claim's.
	sess, busy, err := b.store.Maintenance().BeginPurge(context.Background())
	require.NoError(t, err)
	require.Nil(t, busy)
	err = sess.DropPartition(context.Background(), maintenance.Partition{Name: old}, 50*time.Millisecond)
	require.ErrorIs(t, err, sqlinbox.ErrLockTimeout)
	require.NotErrorIs(t, err, inbox.ErrInFlight)
	require.NoError(t, sess.Close())

	require.NoError(t, tx.Commit())
	deleted, err = p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 10, deleted)
	require.NotContains(t, partitions(t, b.store), old)
	require.Equal(t, map[string]int64{"billing": 1}, b.rows(t))
}

// Moving a blocked period's rows on a table partitioned by processed_at,
// whose fingerprint column came later: every row lands in the new
// partition, column for column, and its event stays a duplicate.
func TestMoveBlockedKeepsClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, postgres, func(c *sqlinbox.Config) { c.Partitioning = sqlinbox.Daily })
	partition, within := testdb.BlockLastTimePartition(t, b.db, b.table)
	b.seed(t, "billing", "ahead-", 5, testdb.Now().Sub(within)) // rows of the dropped period: in the default partition
	_, err := b.db.Exec(`ALTER TABLE ` + b.table + ` ADD COLUMN fingerprint bytea`)
	require.NoError(t, err)
	_, err = b.db.Exec(`UPDATE ` + b.table + ` SET fingerprint = '\x01'`)
	require.NoError(t, err)

	sess, busy, err := b.store.Maintenance().BeginPurge(context.Background())
	require.NoError(t, err)
	require.Nil(t, busy)
	defer sess.Close() //nolint:errcheck // the test fails anyway
	parts, err := sess.CreatePartitions(context.Background(), purge.DefaultPartitionsAhead, time.Second)
	require.NoError(t, err)
	require.Len(t, parts.Blocked, 1)
	require.Equal(t, partition, parts.Blocked[0].Name)
	moved, err := sess.MoveBlocked(context.Background(), parts.Blocked[0], time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 5, moved)
	parts, err = sess.CreatePartitions(context.Background(), purge.DefaultPartitionsAhead, time.Second)
	require.NoError(t, err)
	require.Empty(t, parts.Blocked)

	var n, withFingerprint int
	require.NoError(t, b.db.QueryRow(`SELECT count(*), count(fingerprint) FROM `+partition).Scan(&n, &withFingerprint))
	require.Equal(t, 5, n)
	require.Equal(t, 5, withFingerprint)
	require.Equal(t, map[string]int64{"billing": 5}, b.rows(t))
	require.False(t, b.claim(t, "billing", "ahead-1"), "a moved claim still makes its event a duplicate")
}
