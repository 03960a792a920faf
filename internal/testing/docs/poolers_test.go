//lint:file-ignore SA4006 docs/poolers.md's snippet shows the calls without their error checks, which the test adds after it

package docs_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/lib/pq"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// docs/poolers.md's settings behind a transaction-pooling proxy. Neither
// constructor connects, so the proxy's host need not exist; pgxinbox checks
// the pool's exec mode.
func TestPoolersSettings(t *testing.T) {
	t.Parallel()
	ctx, logger := context.Background(), watermill.NopLogger{}

	db, err := sql.Open("postgres", "postgres://app@pgbouncer:6432/app?binary_parameters=yes")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, TransactionPooling: true, Logger: logger})

	require.NoError(t, err)
	require.NotNil(t, store)

	pool, err := pgxpool.New(ctx, "postgres://app@pgbouncer:6432/app?default_query_exec_mode=exec")
	pgxStore, err := pgxinbox.NewStore(pool, sqlinbox.Config{TransactionPooling: true, Logger: logger})

	require.NoError(t, err)
	require.NotNil(t, pgxStore)
	t.Cleanup(pool.Close)
	t.Cleanup(func() { _ = db.Close() })
}
