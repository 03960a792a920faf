package sqlinbox_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// strictMySQL opens the test MariaDB with a strict sql_mode, where a
// setting beyond its range is an error rather than a warning.
func strictMySQL(t *testing.T) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	cfg.Params = map[string]string{"sql_mode": "'TRADITIONAL'"}
	return testdb.Open(t, "mysql", cfg.FormatDSN())
}

// A ClaimTimeout the database's setting cannot take would fail every claim,
// every message nacked forever: New refuses it, naming the field and the
// limit. The limit itself claims fine (on MariaDB in a strict sql_mode),
// and the database refuses a millisecond or a second more, so the limit is
// the database's own.
func TestClaimTimeoutLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		open    func(t *testing.T) *sql.DB
		config  sqlinbox.Config
		limit   time.Duration
		step    time.Duration
		beyond  string // a statement the database refuses: the limit plus step
		message string
	}{
		{"postgresql", func(t *testing.T) *sql.DB { return testdb.Postgres(t, "pgx") }, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL},
			2147483647 * time.Millisecond, time.Millisecond, `SELECT set_config('lock_timeout', '2147483648ms', true)`, "PostgreSQL's lock_timeout"},
		{"postgresql partitioned", func(t *testing.T) *sql.DB { return testdb.Postgres(t, "pgx") }, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily},
			2147483647 * time.Millisecond, time.Millisecond, `SELECT set_config('lock_timeout', '2147483648ms', true)`, "PostgreSQL's lock_timeout"},
		{"mariadb", strictMySQL, sqlinbox.Config{Dialect: sqlinbox.MySQL},
			100_000_000 * time.Second, time.Second, `SET STATEMENT innodb_lock_wait_timeout=100000001 FOR SELECT 1`, "MariaDB's innodb_lock_wait_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := tc.open(t)
			tc.config.Table = testdb.Table(t, db, "inbox")
			_, err := db.Exec(tc.beyond)
			require.Error(t, err, "the database takes more than the limit")

			for _, over := range []time.Duration{tc.limit + tc.step, 1<<63 - 1} {
				tc.config.ClaimTimeout = over
				_, err = sqlinbox.New(db, tc.config)
				require.ErrorContains(t, err, "ClaimTimeout "+over.String()+" is above "+tc.limit.String()+", the longest "+tc.message+" takes")
			}

			tc.config.ClaimTimeout = tc.limit
			store, err := sqlinbox.New(db, tc.config)
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(ctx))
			t.Cleanup(func() { _ = store.Close() })
			tx, ok, err := claim(ctx, store, nil, "billing", "ev-1")
			require.NoError(t, err)
			require.True(t, ok)
			require.NoError(t, tx.Commit())
		})
	}
}
