package main

import (
	"bytes"
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

const day = 24 * time.Hour

// purgeFixture is an inbox table with rows aged 3 days (billing: 40,
// mailer: 5) and 1 hour (billing: 2).
func purgeFixture(t *testing.T, tg target) *fixture {
	t.Helper()
	f := setup(t, tg)
	f.seed(t, "billing", 3*day, ids("old-", 40)...)
	f.seed(t, "mailer", 3*day, ids("old-", 5)...)
	f.seed(t, "billing", time.Hour, ids("new-", 2)...)
	return f
}

func TestPurgeDryRunThenPurge(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := purgeFixture(t, tg)
		code, out, _ := f.run(t, "purge", "-retention", "2d", "-dry-run")
		require.Equal(t, exitOK, code)
		require.Equal(t, "billing\t40\nmailer\t5\nwould remove 45 rows from "+f.table+"\n", out)
		require.Equal(t, map[string]int{"billing": 42, "mailer": 5}, f.rows(t))

		code, out, errOut := f.run(t, "purge", "-retention", "48h", "-batch", "100", "-once")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 45 rows from "+f.table)
		require.Contains(t, errOut, "Inbox purge round done")
		require.NotContains(t, errOut, "purging", "no progress line outside a terminal")
		require.Equal(t, map[string]int{"billing": 2}, f.rows(t))
	})
}

func TestPurgeConsumerRetentionFlag(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := purgeFixture(t, tg)
		code, out, errOut := f.run(t, "purge", "-retention", "2d", "-consumer-retention", "billing=7d")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 5 rows")
		require.Equal(t, map[string]int{"billing": 42}, f.rows(t))
	})
}

// -progress (the default on a terminal) draws a line that counts the rows
// against the expired rows counted first, and ends it before the round's
// log line.
func TestPurgeProgress(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := purgeFixture(t, tg)
		code, out, errOut := f.run(t, "purge", "-retention", "2d", "-batch", "100", "-progress")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 45 rows")
		require.Contains(t, errOut, "\rpurging "+f.table+": counting the expired rows\x1b[K\rpurging "+f.table+": 0 of about 45 rows (0%)\x1b[K")
		require.Regexp(t, `\rpurging `+f.table+`: 45 of about 45 rows \(100%\), \d+ rows/s\x1b\[K\n[^\r]*Inbox purge round done`, errOut)
	})
}

// Invalid flags and unsafe retentions exit 2 without touching the table; a
// database error exits 1, no database 3.
func TestPurgeExitCodes(t *testing.T) {
	t.Parallel()
	f := purgeFixture(t, postgres)
	dsn, table := testdb.PostgresDSN(), f.table
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"-table", table, "-retention", "2d"}, exitUsage, "-dsn is required"},
		{[]string{"-dsn", dsn, "-table", table}, exitUsage, "-retention is required"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "1h"}, exitUsage, "-retention 1h0m0s is below -min-retention 1d"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2x"}, exitUsage, "invalid value"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2d", "-dialect", "oracle"}, exitUsage, `-dialect "oracle"`},
		{[]string{"-dsn", dsn, "-table", "Bad-Name", "-retention", "2d"}, exitUsage, "-table: table name"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2d", "-dry-run", "-loop"}, exitUsage, "exclude each other"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2d", "-partitioning", "daily"}, exitFailed, "is not partitioned"},
		{[]string{"-dsn", dsn, "-table", table + "_missing", "-retention", "2d"}, exitFailed, "does not exist"},
		{[]string{"-dsn", unreachable(postgres), "-table", table, "-retention", "2d"}, exitConnect, "cannot connect"},
	} {
		code, _, errOut := runCmd(append([]string{"purge"}, tc.args...)...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
	require.Equal(t, map[string]int{"billing": 42, "mailer": 5}, f.rows(t))

	code, out, errOut := f.run(t, "purge", "-retention", "2h", "-allow-short-retention")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 45 rows")
}

// A user that may only read the table counts what a purge would remove,
// and a purge fails, saying what the user lacks; nothing is removed.
func TestPurgeReadOnlyUser(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := purgeFixture(t, tg)
		ro := []string{"-dialect", tg.dialect, "-dsn", tg.readOnly(t, f.db, f.table), "-table", f.table, "-retention", "2d"}
		code, out, errOut := runCmd(append([]string{"purge", "-dry-run"}, ro...)...)
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "would remove 45 rows")
		code, _, errOut = runCmd(append([]string{"purge"}, ro...)...)
		require.Equal(t, exitFailed, code, errOut)
		require.Contains(t, errOut, "removed 0 rows, then failed")
		require.Contains(t, errOut, "\nthe user needs DELETE")
		require.Equal(t, map[string]int{"billing": 42, "mailer": 5}, f.rows(t))
	})
}

// A table that does not exist, and a database that does not answer.
func TestPurgeNoTable(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := setup(t, tg)
		code, _, errOut := f.run(t, "purge", "-retention", "2d", "-table", "missing_table")
		require.Equal(t, exitFailed, code)
		require.Contains(t, errOut, "missing_table does not exist in this database: create it with inbox schema -apply")
		code, _, errOut = runCmd("purge", "-dialect", tg.dialect, "-dsn", unreachable(tg), "-retention", "2d")
		require.Equal(t, exitConnect, code, errOut)
	})
}

// -loop purges until interrupted, then exits 0.
func TestPurgeLoop(t *testing.T) {
	t.Parallel()
	f := purgeFixture(t, postgres)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() {
		done <- run(ctx, append(append([]string{"purge"}, f.flags(t)...), "-retention", "2d", "-loop", "-interval", "50ms"), &out, &errOut)
	}()
	require.Eventually(t, func() bool { return f.rows(t)["billing"] == 2 && f.rows(t)["mailer"] == 0 }, 10*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code)
	case <-time.After(10 * time.Second):
		t.Fatal("-loop did not stop when interrupted")
	}
}

// Durations that do not fit a time.Duration, negative ones and timeouts the
// database cannot take exit 2 and delete nothing. 213504d used to wrap
// around to 25 minutes, which with -allow-short-retention purged nearly
// every row.
func TestPurgeDurationsOutOfRange(t *testing.T) {
	t.Parallel()
	f := purgeFixture(t, postgres)
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"-retention", "213504d"}, `"213504d": at most 106751d`},
		{[]string{"-retention", "99999999999999999999d"}, "at most 106751d"},
		{[]string{"-retention", "2d", "-consumer-retention", "billing=213504d"}, "at most 106751d"},
		{[]string{"-retention", "2d", "-min-retention", "213504d"}, "at most 106751d"},
		{[]string{"-retention", "-5d"}, `"-5d": a duration cannot be negative`},
		{[]string{"-retention", "-99999999999999999999d"}, "cannot be negative"},
		{[]string{"-retention", "-48h"}, "cannot be negative"},
		{[]string{"-retention", "9999999999h"}, "invalid duration"},
		{[]string{"-retention", "2d", "-statement-timeout", "600h"}, "-statement-timeout 600h0m0s is above 596h31m23.647s"},
	} {
		code, out, errOut := f.run(t, "purge", append([]string{"-allow-short-retention"}, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
	require.Equal(t, map[string]int{"billing": 42, "mailer": 5}, f.rows(t))

	code, out, errOut := f.run(t, "purge", "-retention", "106751d", "-dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would remove 0 rows")
}

// A SQLite DSN gets the busy timeout sqlinbox.SQLiteDSN sets, unless it
// sets one itself.
func TestSQLiteBusyTimeout(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"app.db":                                   "app.db?_pragma=busy_timeout%285000%29",
		"file:app.db":                              "file:app.db?_pragma=busy_timeout%285000%29",
		"file:app.db?_pragma=journal_mode(WAL)":    "file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout%285000%29",
		"app.db?_pragma=busy_timeout(100)":         "app.db?_pragma=busy_timeout(100)",
		"app.db?_pragma=%20BUSY_TIMEOUT%20%3D%201": "app.db?_pragma=%20BUSY_TIMEOUT%20%3D%201",
		"app.db?_busy_timeout=100":                 "app.db?_busy_timeout=100",
		"app.db?_timeout=100":                      "app.db?_timeout=100",
		"app.db?%zz":                               "app.db?%zz",
	} {
		require.Equal(t, want, sqliteBusyTimeout(dsn), dsn)
	}
}

// A purge round next to a writer holding SQLite's write lock for a second
// waits for it, whether -dsn is a bare path or a DSN without busy_timeout:
// without a busy timeout every batch failed at once and the round gave up.
func TestSQLiteWaitsForTheWriteLock(t *testing.T) {
	t.Parallel()
	for name, dsn := range map[string]func(path string) string{
		"path":                func(path string) string { return path },
		"DSN without timeout": func(path string) string { return "file:" + path + "?_pragma=journal_mode(WAL)" },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, sqlite)
			f.seed(t, "billing", 3*day, "old")

			// A claim's transaction: SQLiteDSN's BEGIN takes the write lock.
			tx, _, err := f.store.Claim(context.Background(), inboxdriver.Claim{Consumer: "billing", EventID: "held"})
			require.NoError(t, err)
			require.NotNil(t, tx, "a new claim")
			released := make(chan error, 1)
			go func() {
				time.Sleep(time.Second)
				released <- tx.Commit(context.Background())
			}()
			code, out, errOut := runCmd("purge", "-dialect", "sqlite", "-dsn", dsn(testdb.SQLiteFile(t)), "-retention", "2d")
			require.NoError(t, <-released)
			require.Equal(t, exitOK, code, errOut)
			require.Contains(t, out, "removed 1 rows from "+sqlinbox.DefaultTable)
			require.Equal(t, map[string]int{"billing": 1}, f.rows(t))
		})
	}
}

// The partitioned table's purge through the command: it creates the
// partitions ahead and drops none that holds unexpired rows.
func TestPurgePartitioned(t *testing.T) {
	t.Parallel()
	f := setup(t, postgres, "-partitioning", "daily")
	f.seed(t, "billing", 3*day, ids("old-", 4)...)
	code, out, errOut := f.run(t, "purge", "-partitioning", "daily", "-retention", "2d", "-partitions-ahead", "1")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 4 rows")
	require.Contains(t, errOut, "partitions_created")
	require.Empty(t, f.rows(t))
}

// A table whose times the purge would compare wrongly is refused by the
// command as by the package, dry run included, before any row goes, with
// what to do: here SQLite rows written by datetime('now'), 90 minutes
// old, which a 2-hour purge used to delete.
func TestPurgeRefusesForeignTimes(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlite)
	f.seed(t, "billing", 3*time.Hour, "old")
	_, err := f.db.Exec(`INSERT INTO ` + f.table + ` (consumer, event_id, processed_at) VALUES ('billing', 'text', datetime('now', '-90 minutes'))`)
	require.NoError(t, err)
	for _, args := range [][]string{{"-dry-run"}, {}} {
		code, _, errOut := f.run(t, "purge", append([]string{"-retention", "2h", "-allow-short-retention"}, args...)...)
		require.Equal(t, exitFailed, code, errOut)
		require.Contains(t, errOut, "the purge refuses this table: 1 row has a processed_at the purge cannot compare, such as \"20")
		require.Contains(t, errOut, "Migrate the rows SQLite can read")
	}
	require.Equal(t, map[string]int{"billing": 2}, f.rows(t))
}

// Flags mean what they say: zero, which purge.Config would read as its
// default (-min-retention 0s used to mean 24 h, -batch 0 5,000 rows), and
// a batch above purge.MaxBatchSize (-batch 9999999999 was one unbounded
// DELETE on MariaDB) exit 2, saying why, and delete nothing.
func TestPurgeFlagValues(t *testing.T) {
	t.Parallel()
	f := purgeFixture(t, mariadb)
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"-min-retention", "0s"}, "-min-retention 0s: a floor of zero would let any retention through; to purge below the floor, give -allow-short-retention"},
		{[]string{"-min-retention", "0d"}, "-min-retention 0s: a floor of zero"},
		{[]string{"-batch", "0"}, "-batch 0: a batch of no rows purges nothing; give 100 to 50000 (default 5000, on SQLite 1000)"},
		{[]string{"-batch", "99"}, "-batch 99 is below 100, the smallest batch"},
		{[]string{"-batch", "9999999999"}, "-batch 9999999999 is above 50000, the largest batch: one DELETE that large holds its locks"},
		{[]string{"-statement-timeout", "0s"}, "-statement-timeout 0s: a DELETE needs a time limit"},
		{[]string{"-interval", "0s", "-loop"}, "-interval 0s: rounds back to back would never pause"},
		{[]string{"-partitions-ahead", "0"}, "-partitions-ahead 0: a round keeps at least the next partition ready"},
	} {
		code, _, errOut := f.run(t, "purge", append([]string{"-retention", "2d"}, tc.args...)...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
	require.Equal(t, map[string]int{"billing": 42, "mailer": 5}, f.rows(t))
	code, out, errOut := f.run(t, "purge", "-retention", "2d", "-batch", "50000", "-min-retention", "1h")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 45 rows")
}

// A round skipped because another instance holds the purge lock exits 0
// (that instance is doing the work) and says so on a line starting with
// "skipped:", naming the holder and for how long it has held the lock, so
// that cron output tells a skipped round from a purged one, and a stuck
// holder from a busy one.
func TestPurgeSkippedSaysWhoAndHowLong(t *testing.T) {
	forEach(t, func(t *testing.T, tg target) {
		f := purgeFixture(t, tg)
		sess, busy, err := f.store.Maintenance().BeginPurge(context.Background())
		require.NoError(t, err)
		require.Nil(t, busy)
		defer sess.Close()
		for _, extra := range [][]string{nil, {"-dry-run"}} {
			code, out, errOut := f.run(t, "purge", append([]string{"-retention", "2d"}, extra...)...)
			require.Equal(t, exitOK, code, errOut)
			require.Regexp(t, `^skipped: another purge of `+f.table+` is running; (PostgreSQL backend|MySQL connection) \d+ has held the purge lock for \d+s\n$`, out)
		}
		require.Equal(t, map[string]int{"billing": 42, "mailer": 5}, f.rows(t))
	}, postgres, mariadb)
}

// The command's errors name its flags, never the Go configuration fields
// they fill (AllowShortRetention, BatchSize...): its user has only the
// flags.
func TestFlagErrorsNameFlags(t *testing.T) {
	t.Parallel()
	dsn := testdb.PostgresDSN()
	fields := regexp.MustCompile(`\b(Retention|ConsumerRetention|MinRetention|AllowShortRetention|BatchSize|StatementTimeout|Interval|PartitionsAhead|Partitioning|PartitionKey|Table|Dialect)\b`)
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"purge", "-dsn", dsn}, "-retention is required"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2h"}, "-retention 2h0m0s is below -min-retention 1d: rows purged before every copy of their event has arrived let that copy be processed again; keep rows for the broker's retention plus retries, or pass -allow-short-retention"},
		{[]string{"purge", "-dsn", dsn, "-retention", "3d", "-min-retention", "4d"}, "-retention 3d is below -min-retention 4d"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-consumer-retention", "billing=1h"}, "-consumer-retention billing 1h0m0s is below -min-retention 1d"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-consumer-retention", "billing=0d", "-allow-short-retention"}, "-consumer-retention billing must be positive"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-partitioning", "daily", "-consumer-retention", "billing=3d"}, "-consumer-retention is not available with -partitioning daily"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-batch", "10"}, "-batch 10 is below 100, the smallest batch"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-statement-timeout", "-1s"}, "-statement-timeout is negative (-1s)"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-interval", "-1s"}, "-interval is negative (-1s)"},
		{[]string{"purge", "-dsn", dsn, "-retention", "2d", "-partitioning", "daily", "-partitions-ahead", "-1"}, "-partitions-ahead is negative (-1)"},
		{[]string{"schema", "-dialect", "sqlite", "-partitioning", "monthly"}, "-partitioning monthly needs -dialect postgresql"},
		{[]string{"stats", "-dsn", dsn, "-partition-key", "event_time"}, "-partition-key event_time needs -partitioning daily or monthly"},
		{[]string{"check", "-dsn", dsn, "-table", "Orders"}, "-table: table name \"Orders\""},
	} {
		code, out, errOut := runCmd(tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
		require.NotRegexp(t, fields, errOut, "%v names a Go field", tc.args)
	}
}
