package pgxinbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A handler that takes a second connection from the pgxpool its inbox
// transaction came from, four events delivered twice at once: every event
// is processed once, on a plain and on a partitioned table. A pool of one,
// where nothing can be left free and pgxpool does not count its waiters,
// is refused by NewStore.
func TestHandlerTakingSecondConnection(t *testing.T) {
	t.Parallel()
	for _, size := range []int32{1, 2, 4} {
		for _, mode := range []sqlinbox.Partitioning{sqlinbox.NoPartitioning, sqlinbox.Daily} {
			t.Run(fmt.Sprintf("MaxConns=%d/%s", size, mode), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				cfg, err := pgxpool.ParseConfig(testdb.PostgresDSN())
				require.NoError(t, err)
				cfg.MaxConns = size
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(t, err)
				t.Cleanup(pool.Close)
				db := testdb.Postgres(t, "pgx")
				store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: testdb.Table(t, db, "inbox"), Partitioning: mode})
				if size == 1 {
					require.ErrorContains(t, err, "pgxinbox: invalid config: the pool opens at most 1 connection")
					return
				}
				require.NoError(t, err)
				t.Cleanup(func() { _ = store.Close() })
				require.NoError(t, store.CreateSchema(ctx))
				mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
				require.NoError(t, err)
				effects := testdb.Table(t, db, "effects")
				_, err = db.Exec("CREATE TABLE " + effects + " (event_id text NOT NULL)")
				require.NoError(t, err)
				errs := conformancetest.PoolMisuse(t, mw, 4, 2, 90*time.Second, func(ctx context.Context) error {
					var one int
					return pool.QueryRow(ctx, "SELECT 1").Scan(&one)
				}, func(ctx context.Context, id string) error {
					tx, ok := pgxinbox.TxFromContext(ctx)
					if !ok {
						return inbox.ErrNotInInbox
					}
					_, err := tx.Exec(ctx, "INSERT INTO "+effects+" (event_id) VALUES ($1)", id)
					return err
				})
				got := map[string]int{}
				rows, err := db.Query("SELECT event_id, COUNT(*) FROM " + effects + " GROUP BY event_id")
				require.NoError(t, err)
				for rows.Next() {
					var id string
					var n int
					require.NoError(t, rows.Scan(&id, &n))
					got[id] = n
				}
				require.NoError(t, rows.Close())
				require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1, "ev-3": 1}, got, "committed effects; errors: %v", errs)
			})
		}
	}
}
