package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// errorsDB is a database the error tests run on: an inbox table of their
// own, and an effects table without a unique key beside it.
type errorsDB struct {
	name    string
	db      *sql.DB
	dialect sqlinbox.Dialect
	effects string
}

func openErrorsDB(t *testing.T, name string) errorsDB {
	t.Helper()
	e := errorsDB{name: name, dialect: sqlinbox.PostgreSQL}
	switch name {
	case "sqlite":
		e.db, e.dialect = testdb.SQLite(t), sqlinbox.SQLite
	case "lib/pq":
		e.db = testdb.PostgresIfServed(t, "postgres")
	case "pgx-stdlib":
		e.db = testdb.PostgresIfServed(t, "pgx")
	case "mariadb":
		e.db, e.dialect = testdb.MySQLIfServed(t), sqlinbox.MySQL
	default:
		t.Fatalf("unknown database %s", name)
	}
	e.effects = testdb.Table(t, e.db, "effects")
	_, err := e.db.Exec(`CREATE TABLE ` + e.effects + ` (event_id TEXT NOT NULL)`)
	require.NoError(t, err)
	return e
}

// store creates an inbox table configured by cfg (Dialect and Table set
// here) and returns its store.
func (e errorsDB) store(t *testing.T, cfg sqlinbox.Config) *sqlinbox.Store {
	t.Helper()
	cfg.Dialect, cfg.Table = e.dialect, testdb.Table(t, e.db, "errors")
	s, err := sqlinbox.New(e.db, cfg)
	require.NoError(t, err)
	require.NoError(t, s.CreateSchema(context.Background()))
	return s
}

// insertEffect writes the effect of msg's event through its inbox
// transaction.
func (e errorsDB) insertEffect(msg *message.Message) error {
	tx, ok := inbox.TxFromContext(msg.Context())
	if !ok {
		return inbox.ErrNotInInbox
	}
	id, _, _ := inbox.EventIDFromContext(msg.Context())
	q := `INSERT INTO ` + e.effects + ` (event_id) VALUES ($1)`
	if e.dialect != sqlinbox.PostgreSQL {
		q = `INSERT INTO ` + e.effects + ` (event_id) VALUES (?)`
	}
	_, err := tx.ExecContext(msg.Context(), q, id)
	return err
}

func (e errorsDB) effectCount(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.QueryRow(`SELECT COUNT(*) FROM `+e.effects).Scan(&n))
	return n
}

func newMiddleware(t *testing.T, cfg inbox.Config) message.HandlerMiddleware {
	t.Helper()
	mw, err := inbox.NewMiddleware(cfg)
	require.NoError(t, err)
	return mw
}

func eventMsg(id, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
	return msg
}

// Each error that no redelivery can fix is permanent, and never transient,
// so that the recommended stack (Example_retriesAndPoisonQueue) sends the
// message to the poison queue without retrying it. Run against real
// stores: the error is the one the middleware returns to the router.
func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		target error
		run    func(t *testing.T, e errorsDB) error
	}{
		{"missing event id", inbox.ErrMissingEventID, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing", EventID: inbox.EventIDFromMetadata("order_id")})
			_, err := mw(okHandler(e))(eventMsg("order-1", `{}`))
			return err
		}},
		{"event id with a NUL byte", inbox.ErrInvalidEventID, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
			_, err := mw(okHandler(e))(eventMsg("order\x001", `{}`))
			return err
		}},
		{"event id too long", inbox.ErrInvalidEventID, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
			long := make([]byte, inbox.MaxEventIDLength+1)
			for i := range long {
				long[i] = 'x'
			}
			_, err := mw(okHandler(e))(eventMsg(string(long), `{}`))
			return err
		}},
		{"event id not a UUID in a UUID column", inbox.ErrInvalidEventID, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{UUIDEventIDs: true}), Consumer: "billing"})
			_, err := mw(okHandler(e))(eventMsg("order-1", `{}`))
			return err
		}},
		{"no consumer outside a router", inbox.ErrNoConsumer, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{})})
			_, err := mw(okHandler(e))(eventMsg("order-1", `{}`))
			return err
		}},
		{"event id reused for another payload", inbox.ErrEventIDReused, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{
				Store: e.store(t, sqlinbox.Config{Fingerprints: true}), Consumer: "billing",
				Fingerprint: inbox.PayloadFingerprint, OnIDReuse: inbox.IDReuseReject,
			})
			h := mw(okHandler(e))
			_, err := h(eventMsg("order-1", `{"amount":10}`))
			require.NoError(t, err)
			_, err = h(eventMsg("order-1", `{"amount":99}`))
			return err
		}},
		{"stale event under StaleReject", inbox.ErrStaleEvent, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{
				Store: e.store(t, sqlinbox.Config{}), Consumer: "billing",
				MaxEventAge: time.Hour, EventTime: inbox.EventTimeFromMetadata("event_time"), StaleEvents: inbox.StaleReject,
			})
			msg := eventMsg("order-1", `{}`)
			msg.Metadata.Set("event_time", time.Now().Add(-2*time.Hour).Format(time.RFC3339Nano))
			_, err := mw(okHandler(e))(msg)
			return err
		}},
		{"the inbox twice around one handler", inbox.ErrMiswired, func(t *testing.T, e errorsDB) error {
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
			_, err := mw(inbox.Handler(mw, okHandler(e)))(eventMsg("order-1", `{}`))
			return err
		}},
		{"Handler given another middleware than the inbox", inbox.ErrMiswired, func(t *testing.T, e errorsDB) error {
			notInbox := func(h message.HandlerFunc) message.HandlerFunc { return h }
			_, err := inbox.Handler(notInbox, okHandler(e))(eventMsg("order-1", `{}`))
			return err
		}},
	}
	for _, name := range []string{"sqlite", "lib/pq"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					err := c.run(t, e)
					require.ErrorIs(t, err, c.target)
					require.True(t, inbox.IsPermanent(err), "not permanent: %v", err)
					require.False(t, inbox.IsTransient(err), "transient: %v", err)
				})
			}
			require.Equal(t, 1, e.effectCount(t), "only the first event of the reused id has its effect")
		})
	}
}

func okHandler(e errorsDB) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) { return nil, e.insertEffect(msg) }
}

// The errors that pass with time are transient, and not permanent, so that
// the recommended stack keeps the message retrying instead of poisoning it:
// the database stopped, the message's context cancelled, the connection
// terminated by the server under the handler or at the commit, another copy
// holding the claim. Nothing of the failed attempt is committed.
func TestTransientErrors(t *testing.T) {
	t.Parallel()
	requireTransient := func(t *testing.T, err error) {
		t.Helper()
		require.Error(t, err)
		t.Log(err)
		require.True(t, inbox.IsTransient(err), "not transient: %v", err)
		require.False(t, inbox.IsPermanent(err), "permanent: %v", err)
	}
	for _, name := range []string{"lib/pq", "pgx-stdlib"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			t.Run("claim against a stopped database", func(t *testing.T) {
				t.Parallel()
				store := stoppedPostgres(t, name)
				mw := newMiddleware(t, inbox.Config{Store: store, Consumer: "billing"})
				called := false
				_, err := mw(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })(eventMsg("order-1", `{}`))
				requireTransient(t, err)
				require.False(t, called)
			})
			t.Run("connection terminated under the handler", func(t *testing.T) {
				t.Parallel()
				e := openErrorsDB(t, name)
				mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
				_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
					if err := e.insertEffect(msg); err != nil {
						return nil, err
					}
					tx, _ := inbox.TxFromContext(msg.Context())
					// What a server shutting down (pg_ctl stop -m fast) does to
					// every session: FATAL 57P01.
					_, err := tx.ExecContext(msg.Context(), `SELECT pg_terminate_backend(pg_backend_pid())`)
					return nil, err
				})(eventMsg("order-1", `{}`))
				requireTransient(t, err)
				require.Zero(t, e.effectCount(t))
			})
			t.Run("commit on a terminated connection", func(t *testing.T) {
				t.Parallel()
				e := openErrorsDB(t, name)
				mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
				_, err := mw(func(msg *message.Message) ([]*message.Message, error) {
					if err := e.insertEffect(msg); err != nil {
						return nil, err
					}
					terminateBackend(t, e.db, msg)
					return nil, nil
				})(eventMsg("order-1", `{}`))
				requireTransient(t, err)
				require.Contains(t, err.Error(), "committing event")
				require.Zero(t, e.effectCount(t))
			})
			t.Run("another copy holds the claim", func(t *testing.T) {
				t.Parallel()
				e := openErrorsDB(t, name)
				mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{ClaimTimeout: 100 * time.Millisecond}), Consumer: "billing"})
				second := make(chan error, 1)
				h := mw(func(msg *message.Message) ([]*message.Message, error) {
					_, err := mw(okHandler(e))(eventMsg("order-1", `{}`))
					second <- err
					return nil, e.insertEffect(msg)
				})
				_, err := h(eventMsg("order-1", `{}`))
				require.NoError(t, err)
				err = <-second
				require.ErrorIs(t, err, inbox.ErrInFlight)
				requireTransient(t, err)
				require.Equal(t, 1, e.effectCount(t))
			})
			t.Run("produced publisher on a terminated connection", func(t *testing.T) {
				t.Parallel()
				e := openErrorsDB(t, name)
				requireTransient(t, producedOnTerminatedConnection(t, e))
				require.Zero(t, e.effectCount(t))
			})
		})
	}
	for _, name := range []string{"sqlite", "lib/pq"} {
		t.Run(name+"/cancelled context", func(t *testing.T) {
			t.Parallel()
			e := openErrorsDB(t, name)
			mw := newMiddleware(t, inbox.Config{Store: e.store(t, sqlinbox.Config{}), Consumer: "billing"})
			msg := eventMsg("order-1", `{}`)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			msg.SetContext(ctx)
			_, err := mw(okHandler(e))(msg)
			require.ErrorIs(t, err, context.Canceled)
			requireTransient(t, err)
			require.Zero(t, e.effectCount(t))
		})
	}
	// What Watermill's Retry returns when the router closes during its
	// backoff: the context's own error, which never reached the inbox.
	requireTransient(t, context.Canceled)
	requireTransient(t, fmt.Errorf("charging: %w", context.DeadlineExceeded))
	require.False(t, inbox.IsTransient(nil))
	require.False(t, inbox.IsTransient(errors.New("customer not found")), "a handler's own error")
	require.False(t, inbox.IsPermanent(errors.New("customer not found")), "a handler's own error")
}

// stoppedPostgres returns a store whose PostgreSQL does not run: its port
// was free a moment ago, as a stopped server's is.
func stoppedPostgres(t *testing.T, driver string) *sqlinbox.Store {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	sqlDriver := map[string]string{"lib/pq": "postgres", "pgx-stdlib": "pgx"}[driver]
	db, err := sql.Open(sqlDriver, "postgres://postgres@"+addr+"/test?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	return store
}

// terminateBackend ends the server process of msg's inbox transaction from
// another connection, and returns once it is gone.
func terminateBackend(t *testing.T, db *sql.DB, msg *message.Message) {
	t.Helper()
	tx, _ := inbox.TxFromContext(msg.Context())
	var pid int
	require.NoError(t, tx.QueryRowContext(msg.Context(), `SELECT pg_backend_pid()`).Scan(&pid))
	var ok bool
	require.NoError(t, db.QueryRow(`SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
	require.True(t, ok)
	require.Eventually(t, func() bool {
		var n int
		return db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n) == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond)
}

// producedOnTerminatedConnection runs one message through a router whose
// handler returns a message for the produced publisher, which writes
// through the inbox transaction on a connection the server terminates, and
// returns the error the router got.
func producedOnTerminatedConnection(t *testing.T, e errorsDB) error {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	mw := newMiddleware(t, inbox.Config{
		Store: e.store(t, sqlinbox.Config{}),
		ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) {
			return terminatingPublisher{tx: tx, db: e.db, t: t}, nil
		}),
	})
	var (
		mu  sync.Mutex
		got error
	)
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			_, err := h(msg)
			mu.Lock()
			got = err
			mu.Unlock()
			return nil, nil // acked: one attempt is what the test looks at
		}
	})
	router.AddHandler("billing", "orders", ps, "invoices", ps, inbox.Handler(mw, func(msg *message.Message) ([]*message.Message, error) {
		if err := e.insertEffect(msg); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{}`))}, nil
	}))
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	require.NoError(t, ps.Publish("orders", eventMsg("order-1", `{}`)))
	require.NoError(t, router.Close())
	mu.Lock()
	defer mu.Unlock()
	return got
}

// terminatingPublisher writes its messages through tx, an outbox in the
// inbox transaction, and the server terminates that connection under the
// write.
type terminatingPublisher struct {
	tx *sql.Tx
	db *sql.DB
	t  *testing.T
}

func (p terminatingPublisher) Publish(_ string, msgs ...*message.Message) error {
	var pid int
	if err := p.tx.QueryRow(`SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return err
	}
	if _, err := p.db.Exec(`SELECT pg_terminate_backend($1)`, pid); err != nil {
		return err
	}
	for range 200 { // until the server has ended it
		var n int
		if err := p.db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil || n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err := p.tx.Exec(`SELECT 1`) // the outbox row's insert
	return err
}

func (terminatingPublisher) Close() error { return nil }

// The recommended stack during an outage, when the router closes (a
// deploy) while Retry waits between attempts: Retry returns the context's
// error, which the poison filter must see as transient. The message is
// nacked, to be redelivered, and the poison queue gets nothing.
func TestShutdownDuringRetriesPoisonsNothing(t *testing.T) {
	t.Parallel()
	store := stoppedPostgres(t, "pgx-stdlib")
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	// Its own pub/sub: the router closes the handlers' subscribers.
	poisonPS := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	poisoned, err := poisonPS.Subscribe(context.Background(), "poison")
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	poisonQueue, err := middleware.PoisonQueueWithFilter(poisonPS, "poison", func(err error) bool { return !inbox.IsTransient(err) })
	require.NoError(t, err)
	attempts := make(chan struct{}, 100)
	var (
		mu  sync.Mutex
		got []error
	)
	router.AddMiddleware(
		func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				mu.Lock()
				got = append(got, err)
				mu.Unlock()
				return out, err
			}
		},
		poisonQueue,
		middleware.Retry{
			MaxRetries: 3, InitialInterval: time.Second,
			ShouldRetry: func(p middleware.RetryParams) bool { return !inbox.IsPermanent(p.Err) },
		}.Middleware,
		middleware.Recoverer,
	)
	mw := newMiddleware(t, inbox.Config{Store: store})
	router.AddConsumerHandler("billing", "orders", ps, inbox.ConsumerHandler(mw, func(*message.Message) error { return nil }))
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) { attempts <- struct{}{}; return h(msg) }
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	require.NoError(t, ps.Publish("orders", eventMsg("order-1", `{}`)))
	<-attempts // the first claim failed; Retry waits a second
	require.NoError(t, router.Close())

	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, got)
	for _, err := range got { // the first in the backoff; gochannel may redeliver the nack before it stops
		require.ErrorIs(t, err, context.Canceled, "the router closed during the backoff")
		require.True(t, inbox.IsTransient(err))
	}
	select {
	case msg := <-poisoned:
		t.Fatalf("poisoned at shutdown: %s", msg.Metadata.Get(middleware.ReasonForPoisonedKey))
	case <-time.After(100 * time.Millisecond):
	}
}
