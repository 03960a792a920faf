package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// wiring is one test's fixtures: an inbox on SQLite, an effects table
// without a unique key (every extra commit is an extra row), an in-memory
// broker whose Publish returns once the message is acked, and a logger that
// keeps what the middleware reports.
type wiring struct {
	db    *sql.DB
	store *sqlinbox.Store
	ps    *gochannel.GoChannel
	logs  *watermill.CaptureLoggerAdapter

	mu       sync.Mutex
	attempts map[string]int // handler calls per "consumer/event id"
}

func newWiring(t *testing.T) *wiring {
	t.Helper()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	_, err = db.Exec(`CREATE TABLE effects (consumer TEXT NOT NULL, event_id TEXT NOT NULL)`)
	require.NoError(t, err)
	return &wiring{
		db: db, store: store, logs: watermill.NewCaptureLogger(), attempts: map[string]int{},
		ps: gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{}),
	}
}

// middleware is the inbox on w's store, reporting to w.logs.
func (w *wiring) middleware(t *testing.T, cfg inbox.Config) message.HandlerMiddleware {
	t.Helper()
	cfg.Store, cfg.Logger = w.store, w.logs
	mw, err := inbox.NewMiddleware(cfg)
	require.NoError(t, err)
	return mw
}

// handler writes the effect through the inbox transaction, then returns
// fail(attempt) for the attempt (1-based) of this consumer and event.
func (w *wiring) handler(fail func(attempt int) error) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id, consumer, ok := inbox.EventIDFromContext(msg.Context())
		if !ok {
			return nil, errors.New("handler runs without an inbox transaction")
		}
		w.mu.Lock()
		w.attempts[consumer+"/"+id]++
		attempt := w.attempts[consumer+"/"+id]
		w.mu.Unlock()
		tx, _ := inbox.TxFromContext(msg.Context())
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO effects (consumer, event_id) VALUES (?, ?)`, consumer, id); err != nil {
			return nil, err
		}
		if fail != nil {
			return nil, fail(attempt)
		}
		return nil, nil
	}
}

func (w *wiring) attemptsOf(key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.attempts[key]
}

// publish sends one message per id, each returning once acked.
func (w *wiring) publish(t *testing.T, topic string, ids ...string) {
	t.Helper()
	for _, id := range ids {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
		conformancetest.PublishWithin(t, w.ps, topic, msg)
	}
}

func (w *wiring) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	require.NoError(t, w.db.QueryRow(query).Scan(&n))
	return n
}

func (w *wiring) effects(t *testing.T) int { return w.count(t, `SELECT COUNT(*) FROM effects`) }
func (w *wiring) claims(t *testing.T) int  { return w.count(t, `SELECT COUNT(*) FROM `+w.store.Table()) }

// errorLogs returns the messages logged at error level.
func (w *wiring) errorLogs() []watermill.CapturedMessage {
	return w.logs.Captured()[watermill.ErrorLogLevel]
}

// warningLogs are the lines that logged a suspicion.
func (w *wiring) warningLogs() []watermill.CapturedMessage {
	var out []watermill.CapturedMessage
	for _, m := range w.logs.Captured()[watermill.InfoLogLevel] {
		if m.Fields["warning"] != nil {
			out = append(out, m)
		}
	}
	return out
}

// failFirst fails the first n attempts of every event.
func failFirst(n int) func(int) error {
	return func(attempt int) error {
		if attempt <= n {
			return fmt.Errorf("attempt %d fails", attempt)
		}
		return nil
	}
}

func retry() message.HandlerMiddleware {
	return middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware
}

// Each order of the README's table, measured: how many effect rows one
// router commits. The events fail on their first attempts (failFirst(2):
// two failed attempts then a success), which is when an order shows.
func TestMiddlewareOrders(t *testing.T) {
	t.Parallel()
	ignored := errors.New("ignored")
	for _, tc := range []struct {
		name   string
		fail   func(int) error
		events int
		wire   func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc)
		// effects committed, and claims (one per event in every case).
		effects int
	}{
		{
			// One transaction shared by the three attempts: the two failed
			// attempts' writes commit with the third.
			name: "Recoverer, inbox, Retry", fail: failFirst(2), events: 1, effects: 3,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddMiddleware(middleware.Recoverer, mw, retry())
				r.AddHandler("billing", "events", sub, "", nil, h)
			},
		},
		{
			name: "Recoverer, PoisonQueue, Retry, inbox (router)", fail: failFirst(2), events: 1, effects: 1,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				pq, _ := middleware.PoisonQueue(sub, "poison") // fails only for an empty topic
				r.AddMiddleware(middleware.Recoverer, pq, retry(), mw)
				r.AddHandler("billing", "events", sub, "", nil, h)
			},
		},
		{
			// Watermill keeps router-level and handler-level middlewares in
			// one list, in call order: a Retry added to the router after the
			// handler got the inbox lands inside it.
			name: "handler.AddMiddleware(inbox), then router.AddMiddleware(Retry)", fail: failFirst(2), events: 1, effects: 3,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddHandler("billing", "events", sub, "", nil, h).AddMiddleware(mw)
				r.AddMiddleware(middleware.Recoverer, retry())
			},
		},
		{
			name: "router.AddMiddleware(Retry), then handler.AddMiddleware(inbox)", fail: failFirst(2), events: 1, effects: 1,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddMiddleware(middleware.Recoverer, retry())
				r.AddHandler("billing", "events", sub, "", nil, h).AddMiddleware(mw)
			},
		},
		{
			name: "inbox.Handler, then router.AddMiddleware(Retry)", fail: failFirst(2), events: 1, effects: 1,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddHandler("billing", "events", sub, "", nil, inbox.Handler(mw, h))
				r.AddMiddleware(middleware.Recoverer, retry())
			},
		},
		{
			name: "inbox.Handler, handler.AddMiddleware(Retry)", fail: failFirst(2), events: 1, effects: 1,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddHandler("billing", "events", sub, "", nil, inbox.Handler(mw, h)).AddMiddleware(middleware.Recoverer, retry())
			},
		},
		{
			// Every handler call commits in the message's one transaction.
			name: "inbox, Duplicator", events: 5, effects: 10,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddMiddleware(mw, middleware.Duplicator)
				r.AddHandler("billing", "events", sub, "", nil, h)
			},
		},
		{
			// Outside, the second call is a duplicate.
			name: "Duplicator, inbox.Handler", events: 5, effects: 5,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddMiddleware(middleware.Duplicator)
				r.AddHandler("billing", "events", sub, "", nil, inbox.Handler(mw, h))
			},
		},
		{
			// The failed attempt's write commits with the claim; the event
			// is never processed again.
			name: "inbox, IgnoreErrors", fail: func(int) error { return ignored }, events: 1, effects: 1,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddMiddleware(mw, middleware.NewIgnoreErrors([]error{ignored}).Middleware)
				r.AddHandler("billing", "events", sub, "", nil, h)
			},
		},
		{
			// Outside, the ignored error still rolls the attempt back.
			name: "IgnoreErrors, inbox.Handler", fail: func(int) error { return ignored }, events: 1, effects: 0,
			wire: func(r *message.Router, mw message.HandlerMiddleware, sub *gochannel.GoChannel, h message.HandlerFunc) {
				r.AddMiddleware(middleware.NewIgnoreErrors([]error{ignored}).Middleware)
				r.AddHandler("billing", "events", sub, "", nil, inbox.Handler(mw, h))
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWiring(t)
			conformancetest.RunRouter(t, func(r *message.Router) { tc.wire(r, w.middleware(t, inbox.Config{}), w.ps, w.handler(tc.fail)) })
			events := make([]string, tc.events)
			for i := range events {
				events[i] = fmt.Sprintf("ev-%d", i)
			}
			w.publish(t, "events", events...)
			w.publish(t, "events", events...) // and a duplicate of each
			require.Equal(t, tc.effects, w.effects(t), "effect rows")
			wantClaims := tc.events
			if tc.effects == 0 {
				wantClaims = 0
			}
			require.Equal(t, wantClaims, w.claims(t), "inbox rows")
		})
	}
}

// PoisonQueue inside the inbox turns the handler's error into a success. The
// middleware sees the poison mark, rolls back instead of committing the
// failed attempt's write and the claim, and reports the order: the outcome is
// that of PoisonQueue outside the inbox, where replaying the event from the
// poison queue processes it.
func TestPoisonQueueInsideTheInbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		inside bool
	}{{"PoisonQueue, inbox.Handler", false}, {"inbox, PoisonQueue", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWiring(t)
			pq, err := middleware.PoisonQueue(w.ps, "poison")
			require.NoError(t, err)
			// Collected outside the router and its inbox: inside, the
			// collector's claim would wait for SQLite's write lock, held by
			// the transaction whose PoisonQueue is publishing to it.
			poisoned := conformancetest.Collect(t, w.ps, "poison")
			rec := &recorder{}
			conformancetest.RunRouter(t, func(r *message.Router) {
				mw := w.middleware(t, inbox.Config{Observer: rec})
				h := w.handler(failFirst(1))
				if tc.inside {
					r.AddMiddleware(middleware.Recoverer, mw, pq)
				} else {
					r.AddMiddleware(middleware.Recoverer, pq)
					h = inbox.Handler(mw, h)
				}
				r.AddHandler("billing", "events", w.ps, "", nil, h)
			})
			w.publish(t, "events", "a")
			require.Zero(t, w.effects(t), "the failed attempt's write")
			require.Zero(t, w.claims(t))
			copies := poisoned()
			require.Len(t, copies, 1)
			replay := copies[0].Copy()
			logs := w.errorLogs()
			if tc.inside {
				require.Equal(t, []observe.Outcome{observe.Miswired}, rec.outcomes())
				require.Len(t, logs, 1)
				require.ErrorIs(t, logs[0].Err, inbox.ErrMiswired)
				require.Contains(t, logs[0].Msg, "PoisonQueue")
				require.Equal(t, "billing", logs[0].Fields["consumer"])
			} else {
				require.Len(t, logs, 1, "the poisoned message's trace")
				require.Equal(t, "handler_failed", logs[0].Fields["kind"])
			}

			// An operator replays the event from the poison queue.
			conformancetest.PublishWithin(t, w.ps, "events", replay)
			require.Equal(t, 1, w.effects(t))
			require.Equal(t, 1, w.claims(t))
			require.Equal(t, 2, w.attemptsOf("billing/a"))
		})
	}
}

// A handler that succeeds without taking the inbox transaction is reported
// once per consumer, at error level; handlers that take it, declare they do
// not need it, publish their output through it, or took it for an earlier
// message are not.
func TestUnusedTxReportedOncePerConsumer(t *testing.T) {
	t.Parallel()
	w := newWiring(t)
	_, err := w.db.Exec(`CREATE TABLE outbox (uuid TEXT NOT NULL)`)
	require.NoError(t, err)
	conformancetest.RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(w.middleware(t, inbox.Config{
			ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) {
				return outboxPublisher{tx}, nil
			}),
		}))
		// The miswired handler: its effect goes around the claim (here to
		// memory; SQLite would make a write through w.db wait for the
		// inbox transaction's write lock).
		var elsewhere atomic.Int64
		r.AddConsumerHandler("elsewhere", "events", w.ps, func(*message.Message) error {
			elsewhere.Add(1)
			return nil
		})
		r.AddHandler("uses-tx", "events", w.ps, "", nil, w.handler(nil))
		r.AddConsumerHandler("email-only", "events", w.ps, func(msg *message.Message) error {
			inbox.TxNotNeeded(msg.Context())
			return inbox.AfterCommit(msg.Context(), func(context.Context) error { return nil })
		})
		r.AddHandler("produces", "events", w.ps, "out", w.ps, func(msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage(watermill.NewUUID(), nil)}, nil
		})
		// Takes the transaction for the events it handles, and skips the
		// others.
		r.AddConsumerHandler("filter", "events", w.ps, func(msg *message.Message) error {
			if msg.Metadata.Get(inbox.DefaultEventIDMetadataKey) != "ev-0" {
				return nil
			}
			_, err := w.handler(nil)(msg)
			return err
		})
	})
	w.publish(t, "events", "ev-0", "ev-1", "ev-2")
	require.Equal(t, 3, w.count(t, `SELECT COUNT(*) FROM outbox`))

	require.Empty(t, w.errorLogs(), "a suspicion is not an error")
	logs := w.warningLogs()
	require.Len(t, logs, 1, "%v", logs)
	require.Equal(t, "elsewhere", logs[0].Fields["consumer"])
	require.Contains(t, logs[0].Msg, "inbox.TxFromContext")
	require.Contains(t, logs[0].Msg, "inbox.TxNotNeeded")
}

// outboxPublisher writes messages to the outbox table through tx, as a
// watermill-sql publisher bound to it does.
type outboxPublisher struct{ tx *sql.Tx }

func (p outboxPublisher) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if _, err := p.tx.Exec(`INSERT INTO outbox (uuid) VALUES (?)`, m.UUID); err != nil {
			return err
		}
	}
	return nil
}
func (outboxPublisher) Close() error { return nil }

// The inbox on the router and around the handler function: the message is
// refused before any SQL, where the inner claim would wait on the outer one.
func TestInboxAppliedTwice(t *testing.T) {
	t.Parallel()
	w := newWiring(t)
	errs := make(chan error, 1)
	var called atomic.Bool
	conformancetest.RunRouter(t, func(r *message.Router) {
		mw := w.middleware(t, inbox.Config{})
		r.AddMiddleware(conformancetest.ErrorsTo(errs), mw)
		r.AddConsumerHandler("billing", "events", w.ps, inbox.ConsumerHandler(mw, func(*message.Message) error {
			called.Store(true)
			return nil
		}))
	})
	w.publish(t, "events", "a")
	err := <-errs
	require.ErrorIs(t, err, inbox.ErrMiswired)
	require.ErrorContains(t, err, "wraps this handler twice")
	require.False(t, called.Load())
	require.Zero(t, w.claims(t))
}

// Handler refuses a middleware that is not the inbox, and a second call of
// the handler in one transaction, whether the error is returned or
// swallowed on the way.
func TestHandlerGuards(t *testing.T) {
	t.Parallel()
	w := newWiring(t)
	mw := w.middleware(t, inbox.Config{Consumer: "c"})
	msg := func(id string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), nil)
		m.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
		return m
	}

	calls := 0
	h := func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil }
	_, err := inbox.Handler(middleware.Retry{}.Middleware, h)(msg("a"))
	require.ErrorIs(t, err, inbox.ErrMiswired)
	require.ErrorContains(t, err, "not the inbox")
	require.Zero(t, calls)

	for name, inner := range map[string]message.HandlerMiddleware{
		"Duplicator": middleware.Duplicator,
		"swallowing repeater": func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				_, _ = h(msg)
				_, _ = h(msg)
				return nil, nil
			}
		},
	} {
		calls = 0
		composed := func(h message.HandlerFunc) message.HandlerFunc { return mw(inner(h)) }
		_, err = inbox.Handler(composed, w.handler(nil))(msg(name))
		require.ErrorIs(t, err, inbox.ErrMiswired, name)
		require.ErrorContains(t, err, "ran 2 times in one inbox transaction", name)
		require.Equal(t, 1, w.attemptsOf("c/"+name), name)
	}
	require.Zero(t, w.effects(t))
	require.Zero(t, w.claims(t))

	// The plain case: one call, committed.
	_, err = inbox.Handler(mw, w.handler(nil))(msg("ok"))
	require.NoError(t, err)
	require.Equal(t, 1, w.effects(t))
}
