package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A handler that takes a second connection from the pool its inbox
// transaction came from, four events delivered twice at once, on every
// database and pool size of two or more: the router makes progress, one
// handler at a time getting the connection the claims leave free, and every
// event's effect commits once.
//
// Before the claims left a connection free (single runs, 4 connections),
// PostgreSQL on every driver stayed wedged until the 90 s deadline, SQLite
// went on through busy timeouts (36 s), and MariaDB freed itself after
// innodb_lock_wait_timeout (50 s); a finite ClaimTimeout alone still wedged
// PostgreSQL in 1 run of 3. Now each database takes about a second (SQLite
// 6 s).
func TestHandlerTakingSecondConnection(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(t testing.TB) *sql.DB
		sizes   []int
	}{
		{"PostgreSQL/lib-pq", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "postgres") }, []int{2, 4}},
		{"PostgreSQL/pgx-stdlib", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }, []int{2, 4}},
		{"MySQL", sqlinbox.MySQL, testdb.MySQL, []int{2, 4}},
		// One writer at a time: other claims wait out the busy timeout.
		{"SQLite", sqlinbox.SQLite, testdb.SQLite, []int{2}},
	} {
		for _, size := range target.sizes {
			t.Run(fmt.Sprintf("%s/MaxOpenConns=%d", target.name, size), func(t *testing.T) {
				t.Parallel()
				db := target.open(t)
				db.SetMaxOpenConns(size)
				store, effects := poolStore(t, db, target.dialect)
				mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
				require.NoError(t, err)
				errs := conformancetest.PoolMisuse(t, mw, 4, 2, 90*time.Second, func(ctx context.Context) error {
					var one int
					return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
				}, effects.write)
				require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1, "ev-2": 1, "ev-3": 1}, effects.count(t), "errors: %v", errs)
			})
		}
	}
}

// On a pool of one nothing can be left free. A handler that asks the pool
// for a second connection waits for itself: the store says so, once, and
// cancels nothing, so the handler's own deadline ends the wait, and its
// message rolls back.
func TestPoolOfOneWarnsOfAHandlerWaitingForItself(t *testing.T) {
	t.Parallel()
	for _, target := range []struct {
		name    string
		dialect sqlinbox.Dialect
		open    func(t testing.TB) *sql.DB
	}{
		{"PostgreSQL/pgx-stdlib", sqlinbox.PostgreSQL, func(t testing.TB) *sql.DB { return testdb.Postgres(t, "pgx") }},
		{"SQLite", sqlinbox.SQLite, testdb.SQLite},
	} {
		t.Run(target.name, func(t *testing.T) {
			t.Parallel()
			db := target.open(t)
			db.SetMaxOpenConns(1)
			logger := watermill.NewCaptureLogger()
			store, effects := poolStore(t, db, target.dialect, func(c *sqlinbox.Config) { c.Logger = logger })
			mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			msg := message.NewMessage(watermill.NewUUID(), nil)
			msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, "ev-0")
			msg.SetContext(ctx)
			_, err = mw(func(msg *message.Message) ([]*message.Message, error) {
				var one int
				if err := db.QueryRowContext(msg.Context(), "SELECT 1").Scan(&one); err != nil {
					return nil, err
				}
				return nil, effects.write(msg.Context(), "ev-0")
			})(msg)
			require.ErrorIs(t, err, context.DeadlineExceeded, "the handler's own deadline ended its wait")
			require.Empty(t, effects.count(t))
			logs := logger.Captured()[watermill.ErrorLogLevel]
			require.Len(t, logs, 1, "one warning")
			require.Contains(t, logs[0].Msg, "waits for itself")
		})
	}
}

// A pool of one with a readiness probe pinging it every second and a
// handler that holds its transaction for 7 s (an HTTP call): the handler
// runs to its end and commits, nothing is cancelled, nothing is logged.
func TestPoolOfOneWithAProbeRunsSlowHandlers(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	db.SetMaxOpenConns(1)
	logger := watermill.NewCaptureLogger()
	store, effects := poolStore(t, db, sqlinbox.SQLite, func(c *sqlinbox.Config) { c.Logger = logger })
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c", Logger: logger})
	require.NoError(t, err)
	probe, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for probe.Err() == nil {
			_ = db.PingContext(probe)
			time.Sleep(time.Second)
		}
	}()
	for i := range 2 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("ev-%d", i))
		_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
			if err := effects.write(msg.Context(), fmt.Sprintf("ev-%d", i)); err != nil {
				return nil, err
			}
			if i == 0 {
				time.Sleep(7 * time.Second) // an HTTP call
			}
			return nil, nil
		})(msg)
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"ev-0": 1, "ev-1": 1}, effects.count(t))
	require.Empty(t, logger.Captured()[watermill.ErrorLogLevel])
}

// effectTable is a business table the pool tests write their effects to.
type effectTable struct {
	db    *sql.DB
	table string
	ph    string
}

func poolStore(t *testing.T, db *sql.DB, dialect sqlinbox.Dialect, opts ...func(*sqlinbox.Config)) (*sqlinbox.Store, effectTable) {
	t.Helper()
	c := sqlinbox.Config{Dialect: dialect, Table: testdb.Table(t, db, "inbox")}
	for _, o := range opts {
		o(&c)
	}
	store, err := sqlinbox.New(db, c)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	e := effectTable{db: db, table: testdb.Table(t, db, "effects"), ph: "?"}
	if dialect == sqlinbox.PostgreSQL {
		e.ph = "$1"
	}
	_, err = db.Exec("CREATE TABLE " + e.table + " (event_id VARCHAR(255) NOT NULL)")
	require.NoError(t, err)
	return store, e
}

func (e effectTable) write(ctx context.Context, id string) error {
	tx, ok := inbox.TxFromContext(ctx)
	if !ok {
		return inbox.ErrNotInInbox
	}
	_, err := tx.ExecContext(ctx, "INSERT INTO "+e.table+" (event_id) VALUES ("+e.ph+")", id)
	return err
}

func (e effectTable) count(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.db.Query("SELECT event_id, COUNT(*) FROM " + e.table + " GROUP BY event_id")
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		got[id] = n
	}
	require.NoError(t, rows.Err())
	return got
}
