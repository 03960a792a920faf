package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A handler that takes a second connection from the pool its inbox
// transaction came from, four events delivered twice at once, on every
// database and pool size: the router makes progress. With two connections
// or more every event is processed once, one handler at a time getting the
// connection the inbox leaves free; a pool of one cannot leave one, and
// every delivery is refused, loudly, instead of waiting forever.
func TestHandlerTakingSecondConnection(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(t testing.TB) *sql.DB
		sizes   []int
	}{
		// A pool of one is watched through database/sql's count of
		// waiters, whatever the driver: one server and SQLite show it.
		{"PostgreSQL/lib-pq", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "postgres") }, []int{2, 4}},
		{"PostgreSQL/pgx-stdlib", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }, []int{1, 2, 4}},
		{"MySQL", sqlinbox.MySQL, testdb.MySQL, []int{2, 4}},
		// One writer at a time: other claims wait out the busy timeout.
		{"SQLite", sqlinbox.SQLite, testdb.SQLite, []int{1, 2}},
	} {
		for _, size := range target.sizes {
			t.Run(fmt.Sprintf("%s/MaxOpenConns=%d", target.name, size), func(t *testing.T) {
				t.Parallel()
				db := target.open(t)
				db.SetMaxOpenConns(size)
				store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: target.dialect, Table: testdb.Table(t, db, "inbox")})
				require.NoError(t, err)
				require.NoError(t, store.CreateSchema(context.Background()))
				logger := watermill.NewCaptureLogger()
				mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c", Logger: logger})
				require.NoError(t, err)
				events, copies := 4, 2
				if size == 1 {
					events, copies = 1, 1 // each waits PoolWaitTimeout once or twice
				}
				handled, errs := conformancetest.PoolMisuse(t, mw, events, copies, func(ctx context.Context) error {
					var one int
					return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
				})
				if size > 1 {
					want := map[string]int{}
					for e := range events {
						want[fmt.Sprintf("ev-%d", e)] = 1
					}
					require.Equal(t, want, handled)
					for _, err := range errs {
						require.NotErrorIs(t, err, inbox.ErrMiswired)
					}
					return
				}
				require.Empty(t, handled)
				require.Len(t, errs, 1)
				for _, err := range errs {
					require.ErrorIs(t, err, inbox.ErrMiswired)
					require.ErrorContains(t, err, "held the only connection of its pool")
				}
				logs := logger.Captured()[watermill.ErrorLogLevel]
				require.Len(t, logs, 1, "one error line per consumer")
				t.Logf("%s: %v", logs[0].Msg, logs[0].Err)
			})
		}
	}
}
