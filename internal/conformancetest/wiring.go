package conformancetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

// The wiring cases whose outcome depends on the database: a handler whose
// first attempt hits a SQL error, behind middlewares placed inside the
// inbox. The orders that behave the same everywhere are measured on SQLite
// by the root package's tests.

// failedStatement is a statement every database refuses.
const failedStatement = "SELECT * FROM no_such_table_anywhere"

// statementErrorFirst writes the effect, and on the first attempt of each
// event then runs a failing statement and returns its error.
func (b *bundle) statementErrorFirst(msg *message.Message) ([]*message.Message, error) {
	if err := b.writeEffect(msg); err != nil {
		return nil, err
	}
	id, _, _ := inbox.EventIDFromContext(msg.Context())
	if b.attemptsOf(id) == 1 {
		return nil, b.exec(msg.Context(), failedStatement)
	}
	return nil, nil
}

// Retry inside the inbox reruns the handler in the transaction of the failed
// attempt. Where the failed statement aborted it (PostgreSQL), every retry
// fails too, the inbox rolls back and the redelivery commits once; where it
// did not (MySQL, SQLite), the failed attempt's write commits with the
// retry's: two effects. With the handler wrapped by inbox.Handler, Retry is
// outside and each attempt has its own transaction: one effect everywhere.
func testRetryInsideAfterStatementError(t *testing.T, target Target) {
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}.Middleware
	for _, tc := range []struct {
		name    string
		wire    func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, h message.HandlerFunc)
		effects int
	}{
		{"Recoverer, inbox, Retry", func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, h message.HandlerFunc) {
			r.AddMiddleware(middleware.Recoverer, mw, retry)
			r.AddHandler("billing", "events", sub, "", nil, h)
		}, map[bool]int{true: 1, false: 2}[target.FailedStatementAbortsTx]},
		{"Recoverer, Retry, inbox.Handler", func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, h message.HandlerFunc) {
			r.AddMiddleware(middleware.Recoverer, retry)
			r.AddHandler("billing", "events", sub, "", nil, inbox.Handler(mw, h))
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, target)
			ps := pubsub()
			RunRouter(t, func(r *message.Router) { tc.wire(r, b.middleware(t, inbox.Config{}), ps, b.statementErrorFirst) })
			PublishWithin(t, ps, "events", newMsg("a"))
			require.Equal(t, map[string]int{"billing/a": tc.effects}, b.effectCounts(t))
			require.Equal(t, 1, b.claims(t))
		})
	}
}

// PoisonQueue inside the inbox, and a handler that hits a SQL error until
// it is fixed: the middleware sees the poison mark and rolls back instead of
// committing. Without that, PostgreSQL fails the commit of the aborted
// transaction, the message is nacked and poisoned again in a hot loop; MySQL
// and SQLite commit the failed attempt's write with the claim, and the replay
// from the poison queue after the fix is skipped as a duplicate.
func testPoisonQueueInsideAfterStatementError(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	poisoned := Collect(t, ps, "poison")
	pq, err := middleware.PoisonQueue(ps, "poison")
	require.NoError(t, err)
	logger := watermill.NewCaptureLogger()
	var fixed atomic.Bool
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(middleware.Recoverer, b.middleware(t, inbox.Config{Logger: logger}), pq)
		r.AddHandler("billing", "events", ps, "", nil, func(msg *message.Message) ([]*message.Message, error) {
			if err := b.writeEffect(msg); err != nil || fixed.Load() {
				return nil, err
			}
			return nil, b.exec(msg.Context(), failedStatement)
		})
	})
	PublishWithin(t, ps, "events", newMsg("a"))
	require.Empty(t, b.effectCounts(t))
	require.Zero(t, b.claims(t))
	copies := poisoned()
	require.Len(t, copies, 1)
	require.Len(t, logger.Captured()[watermill.ErrorLogLevel], 1)

	fixed.Store(true)
	PublishWithin(t, ps, "events", copies[0].Copy()) // the operator's replay
	require.Equal(t, once("billing", "a"), b.effectCounts(t))
	require.Equal(t, 2, b.attemptsOf("a"))
}

// A handler that succeeds without taking the transaction is logged once;
// one that takes it (through the target's TxFromContext) is not.
func testUnusedTxReported(t *testing.T, target Target) {
	b := setup(t, target)
	logger := NewLogger()
	uses := b.middleware(t, inbox.Config{Consumer: "uses", Logger: logger})
	skips := b.middleware(t, inbox.Config{Consumer: "skips", Logger: logger})
	for _, id := range []string{"a", "b"} {
		_, err := call(uses, b.handler(nil), newMsg(id))
		require.NoError(t, err)
		_, err = call(skips, func(*message.Message) ([]*message.Message, error) { return nil, nil }, newMsg(id))
		require.NoError(t, err)
	}
	require.Empty(t, logger.Errors(), "a suspicion is not an error")
	logs := logger.Warnings()
	require.Len(t, logs, 1)
	require.Equal(t, "skips", logs[0].Fields["consumer"])
}

// One fixed consumer reached from two handler names. On disjoint topics no
// event can reach both: every message is processed, and the sharing is
// warned about once (it was refused, 5 handled and 5 poisoned). An event
// that reaches both is proof: the copy that would be acked unprocessed, as
// the other handler's duplicate, is refused. Sharing is allowed when asked
// for, and then each event runs in one of them.
func testFixedConsumerFromTwoHandlers(t *testing.T, target Target) {
	t.Run("disjoint topics", func(t *testing.T) {
		b := setup(t, target)
		ps := pubsub()
		errs := make(chan error, 20)
		logger := NewLogger()
		RunRouter(t, func(r *message.Router) {
			r.AddMiddleware(ErrorsTo(errs), b.middleware(t, inbox.Config{Consumer: "billing", Logger: logger}))
			r.AddHandler("invoicing", "orders", ps, "", nil, b.handler(nil))
			r.AddHandler("analytics", "clicks", ps, "", nil, b.handler(nil))
		})
		orders, clicks := ids("order", 5), ids("click", 5)
		for i := range orders {
			publish(t, ps, "orders", newMsg(orders[i]))
			publish(t, ps, "clicks", newMsg(clicks[i]))
		}
		close(errs)
		for err := range errs {
			require.NoError(t, err, "no event reached both handlers")
		}
		require.Equal(t, once("billing", append(orders, clicks...)...), b.effectCounts(t))
		require.Empty(t, logger.Errors(), "a suspicion is not an error")
		logs := logger.Warnings()
		require.Len(t, logs, 1, "one warning")
		require.Equal(t, string(observe.SharedConsumer), logs[0].Fields["warning"])
		require.Equal(t, "invoicing, analytics", logs[0].Fields["handlers"])
	})
	for _, share := range []bool{false, true} {
		t.Run(fmt.Sprintf("one event on both topics/ShareConsumer=%v", share), func(t *testing.T) {
			b := setup(t, target)
			ps := pubsub()
			errs := make(chan error, 10)
			obs := &outcomes{}
			RunRouter(t, func(r *message.Router) {
				r.AddMiddleware(ErrorsTo(errs), b.middleware(t, inbox.Config{Consumer: "billing", ShareConsumer: share, Observer: obs}))
				r.AddHandler("invoicing", "orders", ps, "", nil, b.handler(nil))
				r.AddHandler("analytics", "clicks", ps, "", nil, b.handler(nil))
			})
			publish(t, ps, "orders", newMsg("order-1"))
			publish(t, ps, "clicks", newMsg("click-1"), newMsg("order-1"))
			close(errs)
			var got []error
			for err := range errs {
				got = append(got, err)
			}
			// order-1 reached analytics too.
			require.Equal(t, once("billing", "order-1", "click-1"), b.effectCounts(t))
			require.Equal(t, 2, b.claims(t))
			if share {
				require.Empty(t, got, "it was analytics' duplicate")
				return
			}
			require.Len(t, got, 1)
			require.Equal(t, 1, obs.count(observe.Miswired), "metrics tell a wiring mistake from a failing database")
			require.ErrorIs(t, got[0], inbox.ErrMiswired)
			require.ErrorContains(t, got[0], `event "order-1" reached handlers "invoicing" and "analytics", which share the fixed consumer "billing"`)
		})
	}
}

// ErrorsTo acks every message and sends the error behind it to errs, so that
// a test can look at an error a router would otherwise redeliver in a loop.
func ErrorsTo(errs chan<- error) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if _, err := h(msg); err != nil {
				errs <- err
			}
			return nil, nil
		}
	}
}

// Collect acks every message on topic, outside any router, and returns a
// function listing them so far.
func Collect(t *testing.T, sub message.Subscriber, topic string) func() []*message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	var mu sync.Mutex
	var got []*message.Message
	go func() {
		for msg := range msgs {
			mu.Lock()
			got = append(got, msg)
			mu.Unlock()
			msg.Ack()
		}
	}()
	return func() []*message.Message {
		mu.Lock()
		defer mu.Unlock()
		return append([]*message.Message(nil), got...)
	}
}

// PublishWithin publishes msg and fails the test if it is not acked in
// time: a message nacked forever is a hot loop.
func PublishWithin(t *testing.T, pub message.Publisher, topic string, msg *message.Message) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- pub.Publish(topic, msg) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatalf("message %s on %q was never acked: redelivered in a loop", msg.UUID, topic)
	}
}
