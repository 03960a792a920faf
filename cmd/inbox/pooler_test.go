package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// TestMain runs the command itself when a test starts this test binary as
// a child process (mainArgs set), for the tests that kill it.
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(mainArgs); ok {
		os.Exit(run(context.Background(), strings.Split(args, "\n"), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// mainArgs is the environment variable holding a child's arguments, one per
// line.
const mainArgs = "INBOX_TEST_MAIN_ARGS"

// The purge command run again and again through PgBouncer in transaction
// pooling mode, with a DSN that sets nothing for it (the command chooses
// pgx's exec mode itself) and a pool kept busy by other clients, removes
// the expired rows every time and leaves no advisory lock behind, and every
// other subcommand works there too. Before,
// its session lock was released on another server connection than it was
// taken on, and every later round was skipped.
func TestPurgeThroughPooler(t *testing.T) {
	t.Parallel()
	f := setup(t, postgres)
	testdb.BusyPooler(t, 3)
	testdb.RequireServerSwitches(t, testdb.PgBouncer(t, "pgx"))
	for round := range 20 {
		f.seed(t, "billing", 3*day, ids(fmt.Sprintf("r%d-", round), 150)...)
		code, out, errOut := runCmd("purge", "-dsn", testdb.PgBouncerDSN(), "-table", f.table, "-retention", "2d", "-batch", "100")
		require.Equal(t, exitOK, code, errOut)
		require.Contains(t, out, "removed 150 rows from "+f.table, "round %d: %s", round+1, errOut)
		var locks int
		require.NoError(t, f.db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
AND classid = hashtext('watermill_inbox purge')::oid AND objid = $1::regclass::oid`, f.table).Scan(&locks))
		require.Zero(t, locks, "round %d left its lock", round+1)
	}
	f.seed(t, "billing", time.Hour, "recent")
	for _, sub := range [][]string{{"stats"}, {"check"}, {"schema", "-apply"}, {"forget", "-consumer", "billing", "-id", "recent"}, {"forget", "-consumer", "billing", "-id", "recent", "-yes"}} {
		code, _, errOut := runCmd(append(sub, "-dsn", testdb.PgBouncerDSN(), "-table", f.table)...)
		require.Equal(t, exitOK, code, "%v through the pooler: %s", sub, errOut)
	}
	require.Empty(t, f.rows(t), "forget -yes removed the claim")
}

// An inbox purge killed (SIGKILL) while its DELETE waits on a row lock
// leaves no purge lock behind while the server goes on with that DELETE:
// the lock lives on a connection of its own, idle, whose session ends with
// the client's socket. Before, on MariaDB the session running the DELETE
// held the lock until the statement ended, and every round in between
// printed "skipped". On PostgreSQL, through PgBouncer, the proxy ends the
// lock's server connection, left in a transaction.
func TestPurgeKilledMidBatchReleasesTheLock(t *testing.T) {
	mariadbDSN := func(testing.TB) string { return testdb.MySQLDSN() }
	pooledDSN := func(testing.TB) string { return testdb.PgBouncerDSN() }
	for _, tc := range []struct {
		tg  target
		dsn func(testing.TB) string
		// deleting reports whether the killed purge's DELETE still runs.
		deleting string
	}{
		{mariadb, mariadbDSN, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE LOCATE('DELETE /*', INFO) > 0 AND LOCATE(?, INFO) > 0`},
		{postgres, pooledDSN, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'DELETE FROM%' AND strpos(query, $1) > 0 AND state = 'active'`},
	} {
		t.Run(tc.tg.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, tc.tg)
			f.seed(t, "billing", 3*day, ids("old-", 200)...)
			holdOldest(t, f)

			args := []string{"purge", "-dialect", tc.tg.dialect, "-dsn", tc.dsn(t), "-table", f.table, "-retention", "2d", "-statement-timeout", "2m"}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), mainArgs+"="+strings.Join(args, "\n"))
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			deleting := func() bool {
				var n int
				require.NoError(t, f.db.QueryRow(tc.deleting, f.table).Scan(&n))
				return n > 0
			}
			require.Eventually(t, deleting, time.Minute, 20*time.Millisecond, "the purge's DELETE never started")
			_, busy, err := f.store.Maintenance().BeginPurge(context.Background())
			require.NoError(t, err)
			require.NotNil(t, busy, "the running purge holds the lock")

			require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
			_ = cmd.Wait()
			require.Eventually(t, func() bool {
				sess, _, err := f.store.Maintenance().BeginPurge(context.Background())
				require.NoError(t, err)
				if sess == nil {
					return false
				}
				require.NoError(t, sess.Close())
				return true
			}, time.Minute, 20*time.Millisecond, "the killed purge's lock was never released")
			require.True(t, deleting(), "the lock must be free while the killed purge's DELETE still runs")
		})
	}
}

// holdOldest locks the fixture's oldest rows until the test ends, as a
// claim in flight would: a purge's first DELETE waits for them.
func holdOldest(t *testing.T, f *fixture) {
	t.Helper()
	tx, err := f.db.BeginTx(context.Background(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback() })
	_, err = tx.Exec(fmt.Sprintf(`SELECT event_id FROM %s ORDER BY processed_at LIMIT 10 FOR UPDATE`, f.table))
	require.NoError(t, err)
}
