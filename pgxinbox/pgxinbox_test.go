package pgxinbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// fixture is a pgxinbox.Store on a fresh inbox table, with its own pool.
type fixture struct {
	store *pgxinbox.Store
	mw    message.HandlerMiddleware
}

func setup(t *testing.T, sc sqlinbox.Config) *fixture {
	t.Helper()
	sc.Table = testdb.Name("inbox")
	store := newStore(t, sc)
	require.NoError(t, store.CreateSchema(context.Background()))
	t.Cleanup(func() {
		_, _ = store.Pool().Exec(context.Background(), "DROP TABLE IF EXISTS "+sc.Table+", "+store.LeaseTable())
	})
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
	require.NoError(t, err)
	return &fixture{store: store, mw: mw}
}

func (f *fixture) claims(t *testing.T, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, f.store.Pool().QueryRow(context.Background(),
		"SELECT count(*) FROM "+f.store.Table()+" WHERE event_id = $1", eventID).Scan(&n))
	return n
}

// noOpenTransactions checks that every connection the pool holds is idle
// and outside a transaction: no claim's BEGIN leaked back into the pool.
func (f *fixture) noOpenTransactions(t *testing.T) {
	t.Helper()
	pool := f.store.Pool()
	// The lease's heartbeat may hold one for a moment, in the background.
	require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 10*time.Second, 10*time.Millisecond, "connections still acquired")
	conns := pool.AcquireAllIdle(context.Background())
	require.NotEmpty(t, conns)
	for _, c := range conns {
		require.Equal(t, byte('I'), c.Conn().PgConn().TxStatus(), "a pooled connection is inside a transaction")
		c.Release()
	}
}

func msg(id string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
	return m
}

// The claim travels with BEGIN: while the handler runs, the claim is
// invisible to other sessions, so it is not committed on its own and rolls
// back with the handler.
func TestClaimIsInsideTheTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{})
	boom := errors.New("boom")
	_, err := f.mw(func(m *message.Message) ([]*message.Message, error) {
		tx, ok := pgxinbox.TxFromContext(m.Context())
		require.True(t, ok)
		var mine int
		require.NoError(t, tx.QueryRow(m.Context(), "SELECT count(*) FROM "+f.store.Table()+" WHERE event_id = 'x'").Scan(&mine))
		require.Equal(t, 1, mine, "the handler's transaction sees its claim")
		require.Zero(t, f.claims(t, "x"), "another session sees the claim before the commit")
		return nil, boom
	})(msg("x"))
	require.ErrorIs(t, err, boom)
	require.Zero(t, f.claims(t, "x"))
	f.noOpenTransactions(t)
}

// Every way out of the middleware (commit, duplicate, handler error,
// panic, failed statement, claim timeout) gives the connection back to the
// pool outside any transaction.
func TestNoTransactionLeaks(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{ClaimTimeout: 100 * time.Millisecond})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for _, id := range []string{"a", "a", "b"} {
		_, err := f.mw(ok)(msg(id))
		require.NoError(t, err)
	}
	_, err := f.mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("fail") })(msg("c"))
	require.Error(t, err)
	require.Panics(t, func() {
		_, _ = f.mw(func(*message.Message) ([]*message.Message, error) { panic("boom") })(msg("d"))
	})

	// A failed statement aborts the transaction: the commit answers
	// ROLLBACK, which must reach the caller as an error.
	_, err = f.mw(func(m *message.Message) ([]*message.Message, error) {
		tx, _ := pgxinbox.TxFromContext(m.Context())
		_, sqlErr := tx.Exec(m.Context(), "SELECT * FROM no_such_table_anywhere")
		require.Error(t, sqlErr)
		return nil, nil // swallowed
	})(msg("e"))
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	require.Zero(t, f.claims(t, "e"))

	// A claim that times out behind an in-flight copy fails inside the
	// pipeline.
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := f.mw(func(*message.Message) ([]*message.Message, error) {
			close(entered)
			<-release
			return nil, nil
		})(msg("f"))
		done <- err
	}()
	<-entered
	_, err = f.mw(ok)(msg("f"))
	require.ErrorIs(t, err, inbox.ErrInFlight)
	close(release)
	require.NoError(t, <-done)

	require.Equal(t, 1, f.claims(t, "a"))
	for _, id := range []string{"c", "d"} {
		require.Zero(t, f.claims(t, id))
	}
	f.noOpenTransactions(t)
}

func TestNewStoreRefusesWhatItCannotDo(t *testing.T) {
	t.Parallel()
	pool := newStore(t, sqlinbox.Config{Table: "unused"}).Pool()
	_, err := pgxinbox.NewStore(pool, sqlinbox.Config{Dialect: sqlinbox.MySQL})
	require.ErrorContains(t, err, "PostgreSQL")
	_, err = pgxinbox.NewStore(pool, sqlinbox.Config{Partitioning: 7})
	require.ErrorContains(t, err, "Partitioning")
	_, err = pgxinbox.NewStore(pool, sqlinbox.Config{Partitioning: sqlinbox.Daily, Fingerprints: true})
	require.NoError(t, err, "partitioned tables and fingerprints work on pgx")
	_, err = pgxinbox.NewStore(nil, sqlinbox.Config{})
	require.Error(t, err)
	_, err = inbox.NewMiddleware(inbox.Config{})
	require.ErrorContains(t, err, "Store")
	_, err = inbox.NewMiddleware(inbox.Config{Store: newStore(t, sqlinbox.Config{}), Consumer: "a\x00"})
	require.ErrorContains(t, err, "Consumer")
	_, err = inbox.NewMiddleware(inbox.Config{Store: newStore(t, sqlinbox.Config{}), Fingerprint: inbox.PayloadFingerprint})
	require.ErrorContains(t, err, "Fingerprints", "a store without the column")
	_, err = inbox.NewMiddleware(inbox.Config{Store: newStore(t, sqlinbox.Config{Fingerprints: true}), OnIDReuse: 9})
	require.ErrorContains(t, err, "OnIDReuse")
}

type recorder struct {
	mu       sync.Mutex
	outcomes []observe.Outcome
}

func (r *recorder) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(o observe.Observation) {
		r.mu.Lock()
		r.outcomes = append(r.outcomes, o.Outcome)
		r.mu.Unlock()
	}
}

// The observer sees the pgx path's outcomes as it sees database/sql's.
func TestObserver(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{})
	rec := &recorder{}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "c", Observer: rec})
	require.NoError(t, err)
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	_, _ = mw(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("fail") })(msg("a"))
	_, _ = mw(ok)(msg("a"))
	_, _ = mw(ok)(msg("a"))
	_, _ = mw(ok)(msg("a\x00b"))
	require.Equal(t, []observe.Outcome{observe.RolledBack, observe.Processed, observe.Duplicate, observe.InvalidID}, rec.outcomes)
}

// ClaimTimeout bounds the pipelined claim only: the handler's statements
// run under the lock_timeout the application's AfterConnect gave every
// connection, not the role's default, on plain and partitioned tables.
func TestClaimTimeoutKeepsSessionLockTimeout(t *testing.T) {
	t.Parallel()
	for _, mode := range []sqlinbox.Partitioning{sqlinbox.NoPartitioning, sqlinbox.Daily} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(testdb.PostgresDSN())
			require.NoError(t, err)
			cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
				_, err := conn.Exec(ctx, `SET lock_timeout = '1234ms'`)
				return err
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			table := testdb.Name("inbox")
			store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: table, Partitioning: mode, ClaimTimeout: 250 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+", "+store.LeaseTable())
			})
			require.NoError(t, store.CreateSchema(ctx))
			mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c"})
			require.NoError(t, err)
			var inside string
			_, err = mw(func(m *message.Message) ([]*message.Message, error) {
				tx, _ := pgxinbox.TxFromContext(m.Context())
				return nil, tx.QueryRow(m.Context(), `SELECT current_setting('lock_timeout')`).Scan(&inside)
			})(msg("ev-1"))
			require.NoError(t, err)
			require.Equal(t, "1234ms", inside, "the handler's lock_timeout")
			var after string
			require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&after))
			require.Equal(t, "1234ms", after, "the session's lock_timeout")
		})
	}
}
