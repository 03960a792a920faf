package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Every event delivered four times, interleaved, through a router: one
// effect each.
func testEachEventHasOneEffect(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(b.middleware(t, inbox.Config{}))
		r.AddConsumerHandler("billing", "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
			return b.writeEffect(msg)
		}))
	})
	events := ids("ev", 10)
	for range 4 {
		for _, id := range events {
			// A fresh envelope each time, as a relay retry would build.
			publish(t, ps, "events", newMsg(id))
		}
	}
	require.Equal(t, once("billing", events...), b.effectCounts(t))
	require.Equal(t, len(events), b.claims(t))
}

// The producer's event_id survives a republish that changes msg.UUID; a
// redelivery of the same envelope (same UUID, no metadata) is caught by UUID.
func testEventIDMetadataBeatsEnvelopeUUID(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	h := b.handler(nil)
	for range 3 {
		_, err := call(mw, h, newMsg("order-42"))
		require.NoError(t, err)
	}
	plain := message.NewMessage(watermill.NewUUID(), nil)
	for range 3 {
		_, err := call(mw, h, plain.Copy())
		require.NoError(t, err)
	}
	require.Equal(t, map[string]int{"c/order-42": 1, "c/" + plain.UUID: 1}, b.effectCounts(t))
}

// Two routers (two processes, each with its own pool) subscribed to every
// message, sharing one consumer name: each event is processed by exactly one
// of them.
func testRacingRoutersOneWinner(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	var processed atomic.Int64
	for i := range 2 {
		mw, _ := b.freshMiddleware(t, inbox.Config{Consumer: "billing"})
		RunRouter(t, func(r *message.Router) {
			r.AddMiddleware(mw)
			r.AddConsumerHandler(fmt.Sprintf("router-%d", i), "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
				processed.Add(1)
				time.Sleep(time.Millisecond) // widen the race window
				return b.writeEffect(msg)
			}))
		})
	}
	events := ids("ev", 20)
	var wg sync.WaitGroup
	for _, id := range events {
		wg.Go(func() { publish(t, ps, "events", newMsg(id), newMsg(id)) })
	}
	wg.Wait()
	require.Equal(t, once("billing", events...), b.effectCounts(t))
	require.EqualValues(t, len(events), processed.Load(), "handler calls")
}

// Many goroutines claim the same ids at once through separate middleware
// instances: one winner per id, no errors.
func testConcurrentClaimsOneWinner(t *testing.T, target Target) {
	b := setup(t, target)
	const workers = 8
	events := ids("ev", 10)
	mws := make([]message.HandlerMiddleware, workers)
	for i := range mws {
		mws[i] = b.middleware(t, inbox.Config{Consumer: "c"})
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*len(events))
	for w := range workers {
		wg.Go(func() {
			for _, id := range events {
				if _, err := call(mws[w], b.handler(nil), newMsg(id)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// A database with one writer may ask for a retry; it must say so.
		require.ErrorIs(t, err, inbox.ErrInFlight)
	}
	counts := b.effectCounts(t)
	for k, n := range counts {
		require.Equal(t, 1, n, "effects of %s", k)
	}
}

// The handler writes, then fails on its first attempt: the write rolls back,
// the redelivery runs the handler again and commits once.
func testHandlerErrorRollsBack(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	boom := errors.New("boom")
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(b.middleware(t, inbox.Config{}))
		r.AddConsumerHandler("billing", "events", ps, func(msg *message.Message) error {
			_, err := b.handler(func(_ string, attempt int) error {
				if attempt == 1 {
					return boom
				}
				return nil
			})(msg)
			return err
		})
	})
	events := ids("ev", 5)
	for _, id := range events {
		publish(t, ps, "events", newMsg(id))
	}
	require.Equal(t, once("billing", events...), b.effectCounts(t))
	for _, id := range events {
		require.Equal(t, 2, b.attemptsOf(id), "attempts of %s", id)
	}

	// Called directly, the error reaches the caller and nothing stays.
	mw := b.middleware(t, inbox.Config{Consumer: "direct"})
	_, err := call(mw, b.handler(func(string, int) error { return boom }), newMsg("x"))
	require.ErrorIs(t, err, boom)
	require.NotContains(t, b.effectCounts(t), "direct/x")
}

// A panic after the write rolls the transaction back and keeps panicking
// with the same value, so Recoverer (outside the inbox) still sees it.
func testHandlerPanicRollsBack(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	msg := newMsg("p")
	require.PanicsWithValue(t, "handler exploded", func() {
		_, _ = call(mw, func(msg *message.Message) ([]*message.Message, error) {
			require.NoError(t, b.writeEffect(msg))
			panic("handler exploded")
		}, msg)
	})
	require.Empty(t, b.effectCounts(t))
	require.Zero(t, b.claims(t))
	_, err := call(mw, b.handler(nil), msg)
	require.NoError(t, err)
	require.Equal(t, once("c", "p"), b.effectCounts(t))
}

// Recoverer outside the inbox turns the panic into a nack; the redelivery
// commits once.
func testPanicUnderRecovererIsRedelivered(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(middleware.Recoverer, b.middleware(t, inbox.Config{}))
		r.AddConsumerHandler("billing", "events", ps, func(msg *message.Message) error {
			_, err := b.handler(func(_ string, attempt int) error {
				if attempt == 1 {
					panic("first attempt panics")
				}
				return nil
			})(msg)
			return err
		})
	})
	publish(t, ps, "events", newMsg("a"), newMsg("b"), newMsg("a"))
	require.Equal(t, once("billing", "a", "b"), b.effectCounts(t))
	require.Equal(t, 2, b.attemptsOf("a"))
}

// Two handlers on one table, one router-level middleware: each handler
// processes each event once, keyed by its own name.
func testConsumersAreIndependent(t *testing.T, target Target) {
	b := setup(t, target)
	ps := pubsub()
	RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(b.middleware(t, inbox.Config{}))
		for _, name := range []string{"invoicing", "analytics"} {
			r.AddConsumerHandler(name, "events", ps, message.NoPublishHandlerFunc(func(msg *message.Message) error {
				return b.writeEffect(msg)
			}))
		}
	})
	events := ids("ev", 5)
	for range 2 {
		for _, id := range events {
			publish(t, ps, "events", newMsg(id))
		}
	}
	want := once("invoicing", events...)
	for k, v := range once("analytics", events...) {
		want[k] = v
	}
	require.Equal(t, want, b.effectCounts(t))
}

// Bad ids: the handler is not called, nothing is written, the error says
// which sentinel.
func testBadEventIDs(t *testing.T, target Target) {
	b := setup(t, target)
	for _, tc := range []struct {
		name    string
		msg     func() *message.Message
		eventID inbox.EventIDFunc
		want    error
	}{
		{"missing metadata key", func() *message.Message { return message.NewMessage(watermill.NewUUID(), nil) },
			inbox.EventIDFromMetadata("id"), inbox.ErrMissingEventID},
		{"no metadata and no UUID", func() *message.Message { return message.NewMessage("", nil) },
			nil, inbox.ErrMissingEventID},
		{"empty", func() *message.Message {
			m := message.NewMessage(watermill.NewUUID(), nil)
			m.Metadata.Set("id", "")
			return m
		}, inbox.EventIDFromMetadata("id"), inbox.ErrInvalidEventID},
		{"oversized", func() *message.Message { return newMsg(strings.Repeat("x", inbox.MaxEventIDLength+1)) }, nil, inbox.ErrInvalidEventID},
		{"NUL byte", func() *message.Message { return newMsg("a\x00b") }, nil, inbox.ErrInvalidEventID},
		{"invalid UTF-8", func() *message.Message { return newMsg("a\xffb") }, nil, inbox.ErrInvalidEventID},
		{"JSON payload without the field", func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte(`{"other":1}`)) },
			inbox.EventIDFromJSONField("event_id"), inbox.ErrMissingEventID},
		{"JSON payload not an object", func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte(`[1]`)) },
			inbox.EventIDFromJSONField("event_id"), inbox.ErrMissingEventID},
		{"JSON id is a float", func() *message.Message { return message.NewMessage(watermill.NewUUID(), []byte(`{"event_id":1.5}`)) },
			inbox.EventIDFromJSONField("event_id"), inbox.ErrInvalidEventID},
		{"user function fails", func() *message.Message { return newMsg("x") },
			func(*message.Message) (string, error) { return "", errors.New("cannot parse") }, inbox.ErrMissingEventID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw := b.middleware(t, inbox.Config{Consumer: "c", EventID: tc.eventID})
			called := false
			_, err := call(mw, func(*message.Message) ([]*message.Message, error) {
				called = true
				return nil, nil
			}, tc.msg())
			require.ErrorIs(t, err, tc.want)
			require.False(t, called, "handler called")
		})
	}
	require.Zero(t, b.claims(t))

	// The longest valid id and multi-byte UTF-8 are stored exactly.
	long := strings.Repeat("é", inbox.MaxEventIDLength/2)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	for _, id := range []string{long, long, "ünï-çødé", "ünï-çødé", "Case", "case", "trailing ", "trailing"} {
		_, err := call(mw, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	require.Equal(t, once("c", long, "ünï-çødé", "Case", "case", "trailing ", "trailing"), b.effectCounts(t))

	// Ids from a JSON payload field.
	mw = b.middleware(t, inbox.Config{Consumer: "json", EventID: inbox.EventIDFromJSONField("event_id")})
	for _, payload := range []string{`{"event_id":"e-1"}`, `{"event_id":"e-1","x":2}`, `{"event_id":7}`, `{"event_id":7}`} {
		_, err := call(mw, b.handler(nil), message.NewMessage(watermill.NewUUID(), []byte(payload)))
		require.NoError(t, err)
	}
	require.Equal(t, 1, b.effectCounts(t)["json/e-1"])
	require.Equal(t, 1, b.effectCounts(t)["json/7"])
}

// Outside a router there is no handler name: without Config.Consumer the
// message is refused, not keyed by "".
func testNoConsumer(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{})
	_, err := call(mw, b.handler(nil), newMsg("x"))
	require.ErrorIs(t, err, inbox.ErrNoConsumer)
	require.Zero(t, b.claims(t))
}

// A closed pool: an error, the handler never runs.
func testClosedDatabase(t *testing.T, target Target) {
	b := setup(t, target)
	mw, closePool := b.freshMiddleware(t, inbox.Config{Consumer: "c"})
	_, err := call(mw, b.handler(nil), newMsg("warm")) // prepare the claim first
	require.NoError(t, err)
	closePool()
	called := false
	_, err = call(mw, func(*message.Message) ([]*message.Message, error) {
		called = true
		return nil, nil
	}, newMsg("x"))
	require.Error(t, err)
	require.False(t, called)
	require.Equal(t, once("c", "warm"), b.effectCounts(t))
}

// The message context is cancelled while the handler runs (the router is
// shutting down): nothing commits, the message is nacked, and the
// redelivery processes it once.
func testCancelledContextMidHandler(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	ctx, cancel := context.WithCancel(context.Background())
	msg := newMsg("x")
	msg.SetContext(ctx)
	_, err := call(mw, func(msg *message.Message) ([]*message.Message, error) {
		if err := b.writeEffect(msg); err != nil {
			return nil, err
		}
		cancel()
		return nil, nil
	}, msg)
	require.Error(t, err)
	require.Empty(t, b.effectCounts(t))
	require.Zero(t, b.claims(t))

	_, err = call(mw, b.handler(nil), newMsg("x"))
	require.NoError(t, err)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
}

// A handler that writes, ignores a failed statement and returns nil. Where
// the failure poisons the transaction (PostgreSQL), the commit must fail and
// the message be nacked rather than acked with nothing committed. Where the
// transaction survives it (MySQL, SQLite), the claim and the write commit
// together and the redelivery is a duplicate.
func testSwallowedStatementError(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	_, err := call(mw, func(msg *message.Message) ([]*message.Message, error) {
		require.NoError(t, b.writeEffect(msg))
		sqlErr := b.exec(msg.Context(), "SELECT * FROM no_such_table_anywhere")
		require.Error(t, sqlErr)
		return nil, nil // swallowed
	}, newMsg("x"))
	if target.FailedStatementAbortsTx {
		require.Error(t, err)
		require.Zero(t, b.claims(t))
		require.Empty(t, b.effectCounts(t))
		return
	}
	require.NoError(t, err)
	require.Equal(t, 1, b.claims(t))
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	_, err = call(mw, b.handler(nil), newMsg("x"))
	require.NoError(t, err)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	require.Equal(t, 1, b.attemptsOf("x"))
}

// holdClaim starts handling id and blocks inside the transaction until the
// returned release is called with the handler's result.
func holdClaim(t *testing.T, b *bundle, mw message.HandlerMiddleware, id string) (release func(error), done <-chan error) {
	entered := make(chan struct{})
	result := make(chan error, 1)
	// A test that fails before releasing the claim would otherwise leave it
	// held, and the cleanup dropping the table would wait for its lock
	// forever: release it first (cleanups run last registered first).
	t.Cleanup(func() {
		select {
		case result <- errors.New("the test ended without releasing the claim"):
		default:
		}
	})
	out := deliverAsync(mw, func(msg *message.Message) ([]*message.Message, error) {
		if err := b.writeEffect(msg); err != nil {
			return nil, err
		}
		close(entered)
		return nil, <-result
	}, newMsg(id))
	select {
	case <-entered:
	case err := <-out:
		t.Fatalf("first delivery ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("first delivery never reached the handler")
	}
	return func(err error) { result <- err }, out
}

// deliverAsync handles msg with h behind mw in the background; the result
// arrives on the returned channel.
func deliverAsync(mw message.HandlerMiddleware, h message.HandlerFunc, msg *message.Message) <-chan error {
	out := make(chan error, 1)
	go func() {
		_, err := call(mw, h, msg)
		out <- err
	}()
	return out
}

// A duplicate arriving while the first copy is still in its transaction
// waits, then sees the committed claim and is skipped.
func testInFlightDuplicateWaits(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	release, first := holdClaim(t, b, mw, "x")
	second := deliverAsync(mw, b.handler(nil), newMsg("x"))
	select {
	case err := <-second:
		t.Fatalf("duplicate finished while the first copy was in flight: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	release(nil)
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	require.Equal(t, 1, b.attemptsOf("x"))
}

// When the first copy rolls back, the waiting duplicate takes over.
func testInFlightRollbackLetsDuplicateThrough(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	release, first := holdClaim(t, b, mw, "x")
	second := deliverAsync(mw, b.handler(nil), newMsg("x"))
	time.Sleep(100 * time.Millisecond)
	boom := errors.New("boom")
	release(boom)
	require.ErrorIs(t, <-first, boom)
	require.NoError(t, <-second)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	require.Equal(t, 2, b.attemptsOf("x"))
}

// With a claim timeout, the in-flight duplicate gives up with ErrInFlight
// instead of holding its connection; later it is a plain duplicate.
func testClaimTimeout(t *testing.T, target Target) {
	if !target.ClaimTimeout {
		t.Skipf("%s cannot bound a claim's wait", target.Name)
	}
	timeout := max(target.ClaimTimeoutUnit, 100*time.Millisecond)
	b := setup(t, target, func(c *sqlinbox.Config) { c.ClaimTimeout = timeout })
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	release, first := holdClaim(t, b, mw, "x")
	start := time.Now()
	_, err := call(mw, b.handler(nil), newMsg("x"))
	waited := time.Since(start)
	require.ErrorIs(t, err, inbox.ErrInFlight)
	assert.GreaterOrEqual(t, waited, timeout/2)
	assert.Less(t, waited, timeout+5*time.Second)
	release(nil)
	require.NoError(t, <-first)

	_, err = call(mw, b.handler(nil), newMsg("x"))
	require.NoError(t, err)
	require.Equal(t, 1, b.effectCounts(t)["c/x"])

	// The timeout bounds the claim only: a handler statement that waits
	// longer than it for another transaction's lock still succeeds.
	if target.EventIDTime {
		return // the handler's statement below writes the inbox row by its readable id
	}
	release, first = holdClaim(t, b, mw, "y")
	waiting := make(chan struct{})
	handled := make(chan error, 1)
	rollback := errors.New("roll the direct insert back")
	go func() {
		_, err := call(b.middleware(t, inbox.Config{Consumer: "other"}), func(msg *message.Message) ([]*message.Message, error) {
			close(waiting)
			// Blocks on the lock of the held claim of c/y.
			if err := b.exec(msg.Context(), fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES (%s, %s)`,
				b.store.Table(), target.Placeholder(1), target.Placeholder(2)), "c", "y"); err != nil {
				return nil, err
			}
			return nil, rollback
		}, newMsg("z"))
		handled <- err
	}()
	<-waiting
	time.Sleep(2 * timeout)
	boom := errors.New("boom")
	release(boom)
	require.ErrorIs(t, <-first, boom)
	require.ErrorIs(t, <-handled, rollback, "the handler's statement must outlive the claim timeout")
}

// AfterCommit hooks run after the commit, in order, and never for a failed
// attempt or a duplicate.
func testAfterCommitHooks(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	var mu sync.Mutex
	var ran []string
	h := func(fail bool) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			for _, n := range []string{"1", "2"} {
				require.NoError(t, inbox.AfterCommit(msg.Context(), func(ctx context.Context) error {
					// The effect is visible to others when the hook runs.
					var n2 int
					require.NoError(t, b.db.QueryRowContext(ctx, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE event_id = %s", b.effects, target.Placeholder(1)), id).Scan(&n2))
					require.Equal(t, 1, n2)
					mu.Lock()
					ran = append(ran, id+":"+n)
					mu.Unlock()
					return errors.New("hook errors are logged, not returned")
				}))
			}
			if err := b.writeEffect(msg); err != nil {
				return nil, err
			}
			if fail {
				return nil, errors.New("fail")
			}
			return nil, nil
		}
	}
	_, err := call(mw, h(true), newMsg("a"))
	require.Error(t, err)
	_, err = call(mw, h(false), newMsg("a"))
	require.NoError(t, err)
	_, err = call(mw, h(false), newMsg("a")) // duplicate
	require.NoError(t, err)
	require.Equal(t, []string{"a:1", "a:2"}, ran)
	require.ErrorIs(t, inbox.AfterCommit(context.Background(), func(context.Context) error { return nil }), inbox.ErrNotInInbox)
}

// observed records the last observation.
type observed struct{ ob inbox.Observation }

func (o *observed) Start(ctx context.Context) (context.Context, func(inbox.Observation)) {
	return ctx, func(ob inbox.Observation) { o.ob = ob }
}

// A hook that panics or fails after the commit loses only its own effect:
// the message is processed (observed so, with the hooks' failures) and
// acked, the hooks after it still run, the effect stays committed once.
func testAfterCommitHookPanics(t *testing.T, target Target) {
	b := setup(t, target)
	obs := &observed{}
	mw := b.middleware(t, inbox.Config{Consumer: "c", Observer: obs})
	var ran []string
	h := func(msg *message.Message) ([]*message.Message, error) {
		for _, hook := range []func(context.Context) error{
			func(context.Context) error { ran = append(ran, "first"); return nil },
			func(context.Context) error { panic("hook exploded") },
			func(context.Context) error { ran = append(ran, "third"); return errors.New("hook failed") },
			func(context.Context) error { ran = append(ran, "fourth"); return nil },
		} {
			require.NoError(t, inbox.AfterCommit(msg.Context(), hook))
		}
		return nil, b.writeEffect(msg)
	}
	var err error
	require.NotPanics(t, func() { _, err = call(mw, h, newMsg("a")) })
	require.NoError(t, err, "the transaction committed: the message is acked")
	require.Equal(t, []string{"first", "third", "fourth"}, ran)
	require.Equal(t, inbox.OutcomeProcessed, obs.ob.Outcome)
	require.NoError(t, obs.ob.Err)
	require.ErrorContains(t, obs.ob.AfterCommitErr, "after-commit hook panicked: hook exploded")
	require.ErrorContains(t, obs.ob.AfterCommitErr, "hook failed")
	require.Equal(t, once("c", "a"), b.effectCounts(t))

	_, err = call(mw, h, newMsg("a"))
	require.NoError(t, err)
	require.Equal(t, inbox.OutcomeDuplicate, obs.ob.Outcome)
	require.NoError(t, obs.ob.AfterCommitErr)
	require.Equal(t, once("c", "a"), b.effectCounts(t))
}

// A hook registered once the transaction has ended, committed or rolled
// back (a context kept past the handler, a goroutine it started), would
// never run: AfterCommit says so instead of returning nil.
func testAfterCommitAfterTheHandler(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	for _, fail := range []error{nil, errors.New("fail")} {
		var kept context.Context
		late := make(chan error, 1)
		_, err := call(mw, func(msg *message.Message) ([]*message.Message, error) {
			kept = msg.Context()
			return nil, fail
		}, newMsg(fmt.Sprintf("late-%v", fail != nil)))
		require.ErrorIs(t, err, fail)
		go func() { late <- inbox.AfterCommit(kept, func(context.Context) error { panic("must never run") }) }()
		require.ErrorIs(t, <-late, inbox.ErrTxEnded)
		require.ErrorIs(t, inbox.AfterCommit(kept, func(context.Context) error { panic("must never run") }), inbox.ErrTxEnded)
	}
}

// The message leaves the middleware with the context it came in with.
func testContextRestored(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	type key struct{}
	for _, id := range []string{"x", "x"} {
		msg := newMsg(id)
		ctx := context.WithValue(context.Background(), key{}, "orig")
		msg.SetContext(ctx)
		_, err := call(mw, b.handler(nil), msg)
		require.NoError(t, err)
		require.Equal(t, ctx, msg.Context())
		_, ok := inbox.TxFromContext(msg.Context())
		require.False(t, ok)
	}
}

// UUID mode: non-UUIDs are refused before any SQL; case variants of one
// UUID are one event.
func testUUIDEventIDs(t *testing.T, target Target) {
	skipReadableIDs(t, target, "it needs ids that are not UUIDs to reach the store")
	b := setup(t, target, func(c *sqlinbox.Config) { c.UUIDEventIDs = true })
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	id := "0b5a3c9e-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	for _, v := range []string{id, strings.ToUpper(id), id} {
		_, err := call(mw, b.handler(nil), newMsg(v))
		require.NoError(t, err)
	}
	for _, bad := range []string{"order-1", "0b5a3c9e1f2d4e5f8a9b0c1d2e3f4a5b", "{" + id + "}", id + " "} {
		_, err := call(mw, b.handler(nil), newMsg(bad))
		require.ErrorIs(t, err, inbox.ErrInvalidEventID, bad)
	}
	require.Equal(t, once("c", id), b.effectCounts(t))
	require.Equal(t, 1, b.claims(t))
}

// CreateSchema runs again, and from several goroutines at once, without
// error.
func testSchemaIdempotent(t *testing.T, target Target) {
	b := setup(t, target)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	table := b.store.Table() + "_fresh"
	t.Cleanup(func() {
		_, _ = b.db.Exec("DROP TABLE IF EXISTS " + table)
		_, _ = b.db.Exec("DROP TABLE IF EXISTS " + table + "_consumers")
	})
	for range 4 {
		wg.Go(func() {
			s, err := sqlinbox.New(target.Open(t), sqlinbox.Config{Dialect: target.Dialect, Table: table, Partitioning: target.Partitioning, TransactionPooling: target.TransactionPooling})
			if err == nil {
				err = s.CreateSchema(context.Background())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, b.store.CreateSchema(context.Background()))
	require.Contains(t, b.store.SchemaSQL(), "processed_at")
}
