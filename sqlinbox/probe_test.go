package sqlinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The store recognises a statement the database cancelled, at its client's
// request or on a timeout the session set, by SQLSTATE or error number
// wherever errors.As finds it: PostgreSQL's statement_timeout and lib/pq's
// cancel of a statement whose context ended (57014), MariaDB's
// max_statement_time (1969) and KILL QUERY (1317). Not a failed statement,
// not the message text alone.
func TestIsCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled := map[string]func(t *testing.T) (*sqlinbox.Store, *sql.DB, error){
		"lib-pq statement_timeout":     func(t *testing.T) (*sqlinbox.Store, *sql.DB, error) { return pgStatementTimeout(t, "postgres") },
		"pgx-stdlib statement_timeout": func(t *testing.T) (*sqlinbox.Store, *sql.DB, error) { return pgStatementTimeout(t, "pgx") },
		"lib-pq context": func(t *testing.T) (*sqlinbox.Store, *sql.DB, error) {
			db := testdb.Postgres(t, "postgres")
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			_, err := db.ExecContext(cctx, `SELECT pg_sleep(5)`)
			return newProbeStore(t, db, sqlinbox.PostgreSQL), db, err
		},
		"mariadb max_statement_time": func(t *testing.T) (*sqlinbox.Store, *sql.DB, error) {
			db := testdb.MySQL(t)
			_, err := db.ExecContext(ctx, `SET STATEMENT max_statement_time = 0.1 FOR SELECT SLEEP(5)`)
			return newProbeStore(t, db, sqlinbox.MySQL), db, err
		},
		"mariadb KILL QUERY": func(t *testing.T) (*sqlinbox.Store, *sql.DB, error) {
			db := testdb.MySQL(t)
			conn, err := db.Conn(ctx)
			require.NoError(t, err)
			defer func() { _ = conn.Close() }()
			var id int64
			require.NoError(t, conn.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id))
			go func() {
				for range 500 { // until the statement runs, then kill it
					var n int
					if db.QueryRow(`SELECT COUNT(*) FROM information_schema.processlist WHERE id = ? AND info LIKE 'SELECT SLEEP%'`, id).Scan(&n) == nil && n == 1 {
						_, _ = db.Exec(`KILL QUERY ?`, id)
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
			_, err = conn.ExecContext(ctx, `SELECT SLEEP(10)`)
			return newProbeStore(t, db, sqlinbox.MySQL), db, err
		},
	}
	for name, run := range cancelled {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, db, err := run(t)
			require.Error(t, err)
			require.True(t, store.IsCancelled(err), "%v", err)
			require.True(t, store.IsCancelled(fmt.Errorf("handler: %w", err)), "wrapped")
			require.True(t, store.IsCancelled(errors.Join(errors.New("other"), err)), "joined")
			require.False(t, store.IsCancelled(errors.New(err.Error())), "the message text alone")
			_, failed := db.ExecContext(ctx, `SELEC 1`)
			require.Error(t, failed)
			require.False(t, store.IsCancelled(failed), "a failed statement: %v", failed)
		})
	}
	require.False(t, newProbeStore(t, testdb.SQLite(t), sqlinbox.SQLite).IsCancelled(nil))
}

func pgStatementTimeout(t *testing.T, driver string) (*sqlinbox.Store, *sql.DB, error) {
	db := testdb.Postgres(t, driver)
	tx, err := db.Begin()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.Exec(`SET LOCAL statement_timeout = 100`)
	require.NoError(t, err)
	_, err = tx.Exec(`SELECT pg_sleep(5)`)
	return newProbeStore(t, db, sqlinbox.PostgreSQL), db, err
}

func newProbeStore(t *testing.T, db *sql.DB, dialect sqlinbox.Dialect) *sqlinbox.Store {
	t.Helper()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: dialect, Table: testdb.Name("inbox")})
	require.NoError(t, err)
	return store
}

// ProbeDB answers nil while the database answers, even with an error of its
// own, and an error when it does not: its pool closed, or its port
// refusing connections as a stopped server's does.
func TestProbeDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, db := range map[string]*sql.DB{
		"lib-pq": testdb.Postgres(t, "postgres"), "pgx-stdlib": testdb.Postgres(t, "pgx"),
		"mariadb": testdb.MySQL(t), "sqlite": testdb.SQLite(t),
	} {
		dialect := map[string]sqlinbox.Dialect{"mariadb": sqlinbox.MySQL, "sqlite": sqlinbox.SQLite}[name]
		if dialect == nil {
			dialect = sqlinbox.PostgreSQL
		}
		require.NoError(t, newProbeStore(t, db, dialect).ProbeDB(ctx), name)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	stopped, err := sql.Open("pgx", "postgres://postgres@"+addr+"/test?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(func() { _ = stopped.Close() })
	require.Error(t, newProbeStore(t, stopped, sqlinbox.PostgreSQL).ProbeDB(ctx), "a stopped server")

	closed := testdb.Postgres(t, "pgx")
	store := newProbeStore(t, closed, sqlinbox.PostgreSQL)
	require.NoError(t, closed.Close())
	require.Error(t, store.ProbeDB(ctx), "a closed pool")
}
