package sqlinbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// ClaimTimeout bounds the claim only: the handler's statements run under
// the lock_timeout the application gave its connections, not the role's
// default (SET LOCAL ... TO DEFAULT would give 0, wait forever), and the
// session keeps its value after the transaction.
func TestClaimTimeoutKeepsSessionLockTimeout(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "postgres"} {
		for _, mode := range []sqlinbox.Partitioning{sqlinbox.NoPartitioning, sqlinbox.Daily} {
			t.Run(driver+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testdb.Postgres(t, driver)
				db.SetMaxOpenConns(1) // every claim runs on the session set below
				store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: testdb.Table(t, db, "inbox"), Partitioning: mode, ClaimTimeout: 250 * time.Millisecond})
				require.NoError(t, err)
				require.NoError(t, store.CreateSchema(ctx))
				_, err = db.Exec(`SET lock_timeout = '1234ms'`)
				require.NoError(t, err)
				for _, id := range []string{"ev-1", "ev-2"} {
					tx, ok, err := claim(ctx, store, nil, "billing", id)
					require.NoError(t, err)
					require.True(t, ok)
					var inside string
					err = tx.QueryRow(`SELECT current_setting('lock_timeout')`).Scan(&inside)
					require.NoError(t, tx.Commit()) // before any assertion: the pool has one connection
					require.NoError(t, err)
					require.Equal(t, "1234ms", inside, "the handler's lock_timeout")
					var after string
					require.NoError(t, db.QueryRow(`SELECT current_setting('lock_timeout')`).Scan(&after))
					require.Equal(t, "1234ms", after, "the session's lock_timeout")
				}
			})
		}
	}
}
