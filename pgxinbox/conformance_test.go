package pgxinbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// TestConformance runs the middleware's whole behaviour through the native
// pgx path: the same suite as every database/sql driver, on a plain table,
// on one partitioned daily by processed_at and on one partitioned daily by
// the time inside event ids.
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, layout := range []string{"", "daily-partitions", "event-time-partitions", "pgbouncer", "pgbouncer/event-time-partitions"} {
		target := nativeTarget("PostgreSQL/pgx-native", testdb.PostgresDSN())
		if pooled := strings.HasPrefix(layout, "pgbouncer"); pooled {
			// Through PgBouncer in transaction pooling mode, with the DSN
			// settings and the Config docs/poolers.md give.
			target = nativeTarget("PostgreSQL/pgx-native", testdb.PoolerDSN("pgx"))
			target.Open = func(t testing.TB) *sql.DB { return testdb.PgBouncer(t, "pgx") }
			target.TransactionPooling = true
		}
		if layout != "" {
			target.Name += "/" + layout
		}
		if strings.HasSuffix(layout, "partitions") {
			target.Partitioning = sqlinbox.Daily
			target.EventIDTime = strings.HasSuffix(layout, "event-time-partitions")
		}
		t.Run(target.Name, func(t *testing.T) {
			t.Parallel()
			conformancetest.Run(t, target)
		})
	}
}

// nativeTarget is the suite on pgxinbox.Store, its pools opened on dsn.
func nativeTarget(name, dsn string) conformancetest.Target {
	return conformancetest.Target{
		Name:                    name,
		Dialect:                 sqlinbox.PostgreSQL,
		Open:                    func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") },
		Placeholder:             conformancetest.Dollar,
		FailedStatementAbortsTx: true,
		ClaimTimeout:            true,
		Native: &conformancetest.Native{
			Store: func(t testing.TB, sc sqlinbox.Config) (inboxdriver.Store, func(), error) {
				pool, err := pgxpool.New(context.Background(), dsn)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				store, err := pgxinbox.NewStore(pool, sc)
				if err != nil {
					return nil, pool.Close, err
				}
				t.Cleanup(func() { _ = store.Close() })
				return store, pool.Close, nil
			},
			Exec: func(ctx context.Context, query string, args ...any) error {
				tx, ok := pgxinbox.TxFromContext(ctx)
				if !ok {
					return errors.New("handler runs without a pgx inbox transaction")
				}
				_, err := tx.Exec(ctx, query, args...)
				return err
			},
		},
	}
}

// newStore opens a pool of its own, closed when the test ends, and a
// pgxinbox.Store on it.
func newStore(t testing.TB, sc sqlinbox.Config) *pgxinbox.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.PostgresDSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	return store
}
