package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// inbox makes an inbox table on the test PostgreSQL with rows aged 3 days
// (billing: 40, mailer: 5) and 1 hour (billing: 2).
func inbox(t *testing.T) (*sql.DB, string) {
	t.Helper()
	db := testdb.Postgres(t, "pgx")
	table := testdb.Table(t, db, "cmd_purge")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	for _, r := range []struct {
		consumer string
		n        int
		age      string
	}{{"billing", 40, "3 days"}, {"mailer", 5, "3 days"}, {"billing", 2, "1 hour"}} {
		_, err := db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at)
SELECT $1, $2 || g, now() - $3::interval FROM generate_series(1, $4::int) g`, table), r.consumer, r.age+"-", r.age, r.n)
		require.NoError(t, err)
	}
	return db, table
}

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&n))
	return n
}

func runCmd(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDryRunThenPurge(t *testing.T) {
	t.Parallel()
	db, table := inbox(t)
	code, out, _ := runCmd("-dsn", testdb.PostgresDSN(), "-table", table, "-retention", "2d", "-dry-run")
	require.Equal(t, exitOK, code)
	require.Equal(t, "billing\t40\nmailer\t5\nwould remove 45 rows from "+table+"\n", out)
	require.Equal(t, 47, count(t, db, table))

	code, out, errOut := runCmd("-dsn", testdb.PostgresDSN(), "-table", table, "-retention", "48h", "-batch", "100", "-once")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 45 rows from "+table)
	require.Contains(t, errOut, "Inbox purge round done")
	require.Equal(t, 2, count(t, db, table))
}

func TestConsumerRetentionFlag(t *testing.T) {
	t.Parallel()
	db, table := inbox(t)
	code, out, errOut := runCmd("-dsn", testdb.PostgresDSN(), "-table", table, "-retention", "2d", "-consumer-retention", "billing=7d")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 5 rows")
	require.Equal(t, 42, count(t, db, table))
}

// Invalid flags and unsafe retentions exit 2 without touching the table; a
// database error exits 1.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	db, table := inbox(t)
	dsn := testdb.PostgresDSN()
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"-table", table, "-retention", "2d"}, exitUsage, "-dsn is required"},
		{[]string{"-dsn", dsn, "-table", table}, exitUsage, "Retention is required"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "1h"}, exitUsage, "below MinRetention"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2x"}, exitUsage, "invalid value"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2d", "-dialect", "oracle"}, exitUsage, `-dialect "oracle"`},
		{[]string{"-dsn", dsn, "-table", "Bad-Name", "-retention", "2d"}, exitUsage, "Table"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2d", "-dry-run", "-loop"}, exitUsage, "exclude each other"},
		{[]string{"-dsn", dsn, "-table", table, "-retention", "2d", "-partitioning", "daily"}, exitFailed, "is not partitioned"},
		{[]string{"-dsn", dsn, "-table", table + "_missing", "-retention", "2d"}, exitFailed, "does not exist"},
	} {
		code, _, errOut := runCmd(tc.args...)
		require.Equal(t, tc.code, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
	require.Equal(t, 47, count(t, db, table))

	code, out, errOut := runCmd("-dsn", dsn, "-table", table, "-retention", "2h", "-allow-short-retention")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 45 rows")
}

// -loop purges until interrupted, then exits 0.
func TestLoop(t *testing.T) {
	t.Parallel()
	db, table := inbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-dsn", testdb.PostgresDSN(), "-table", table, "-retention", "2d", "-loop", "-interval", "50ms"}, &out, &errOut)
	}()
	require.Eventually(t, func() bool { return count(t, db, table) == 2 }, 10*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, exitOK, code)
	case <-time.After(10 * time.Second):
		t.Fatal("-loop did not stop when interrupted")
	}
}

// sqliteInbox makes the default inbox table in test t's SQLite file, with
// one row of consumer billing per event id, claimed at now plus the SQLite
// date modifier given ("-3 days").
func sqliteInbox(t *testing.T, rows map[string]string) (*sql.DB, *sqlinbox.Store) {
	t.Helper()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	for id, age := range rows {
		_, err := db.Exec(`INSERT INTO watermill_inbox (consumer, event_id, processed_at)
VALUES ('billing', ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?))`, id, age)
		require.NoError(t, err)
	}
	return db, store
}

// SQLite through the same flags.
func TestSQLite(t *testing.T) {
	t.Parallel()
	db, _ := sqliteInbox(t, map[string]string{"old": "-3 days", "new": "-0 seconds"})
	code, out, errOut := runCmd("-dialect", "sqlite", "-dsn", sqlinbox.SQLiteDSN(testdb.SQLiteFile(t)), "-retention", "2d")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "removed 1 rows from watermill_inbox")
	require.Equal(t, 1, count(t, db, "watermill_inbox"))
}

// Durations that do not fit a time.Duration, negative ones and timeouts the
// database cannot take exit 2 and delete nothing. 213504d used to wrap
// around to 25 minutes, which with -allow-short-retention purged nearly
// every row.
func TestDurationsOutOfRange(t *testing.T) {
	t.Parallel()
	db, table := inbox(t)
	dsn := testdb.PostgresDSN()
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
		{[]string{"-retention", "2d", "-statement-timeout", "600h"}, "StatementTimeout 600h0m0s is above 596h31m23.647s"},
	} {
		args := append([]string{"-dsn", dsn, "-table", table, "-allow-short-retention"}, tc.args...)
		code, out, errOut := runCmd(args...)
		require.Equal(t, exitUsage, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.err, "%v", tc.args)
	}
	require.Equal(t, 47, count(t, db, table))

	code, out, errOut := runCmd("-dsn", dsn, "-table", table, "-retention", "106751d", "-dry-run")
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
			db, store := sqliteInbox(t, map[string]string{"old": "-3 days"})

			// A claim's transaction: SQLiteDSN's BEGIN takes the write lock.
			tx, _, err := store.Claim(context.Background(), nil, "billing", "held", nil)
			require.NoError(t, err)
			require.NotNil(t, tx, "a new claim")
			released := make(chan error, 1)
			go func() {
				time.Sleep(time.Second)
				released <- tx.Commit(context.Background())
			}()
			code, out, errOut := runCmd("-dialect", "sqlite", "-dsn", dsn(testdb.SQLiteFile(t)), "-retention", "2d")
			require.NoError(t, <-released)
			require.Equal(t, exitOK, code, errOut)
			require.Contains(t, out, "removed 1 rows from watermill_inbox")
			require.Equal(t, 1, count(t, db, "watermill_inbox"))
		})
	}
}
