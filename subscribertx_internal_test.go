package inbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The walk is proven against real watermill-sql subscribers in the root
// package's tests; here it meets every context the standard library makes,
// under a key type of this package.
type contextKey string

func isTestKey(t reflect.Type) bool { return t == reflect.TypeFor[contextKey]() }

// testTx finds transactions under the package's test keys.
var testTx = &txFinder{isKey: isTestKey}

// contextKeys returns the keys a walk up ctx finds, with no context known
// clean.
func contextKeys(ctx context.Context, isKey func(reflect.Type) bool) []any {
	keys, _, _ := (&txFinder{isKey: isKey}).walk(ctx)
	return keys
}

// otherKey stands for the key types of other packages, which the walk skips.
type otherKey string

type fakeTx struct{ id int }

func (*fakeTx) Commit() error   { return nil }
func (*fakeTx) Rollback() error { return nil }

// custom is a context of its own kind, with its parent in a named field.
type custom struct{ parent context.Context }

func (c custom) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c custom) Done() <-chan struct{}       { return c.parent.Done() }
func (c custom) Err() error                  { return c.parent.Err() }
func (c custom) Value(key any) any           { return c.parent.Value(key) }
func (c custom) String() string              { return "custom" }

func TestFindSubscriberTxThroughEveryContext(t *testing.T) {
	t.Parallel()
	tx := &fakeTx{id: 1}
	ctx := context.WithValue(context.Background(), contextKey("tx"), tx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, time.Hour)
	defer cancelTimeout()
	ctx, cancelCause := context.WithCancelCause(ctx)
	defer cancelCause(nil)
	ctx, cancelDeadline := context.WithDeadlineCause(ctx, time.Now().Add(time.Hour), nil)
	defer cancelDeadline()
	ctx = context.WithoutCancel(ctx)
	ctx = context.WithValue(custom{ctx}, otherKey("other"), 1)
	// A context stored as a value is not a parent.
	ctx = context.WithValue(ctx, otherKey("stored"), context.WithValue(context.Background(), contextKey("stored"), &fakeTx{id: 2}))
	stop := context.AfterFunc(ctx, func() {})
	defer stop()
	ctx, cancelAfter := context.WithCancel(ctx)
	defer cancelAfter()

	require.Equal(t, []any{contextKey("tx")}, contextKeys(ctx, isTestKey))
	key, value, ok := testTx.find(ctx)
	require.True(t, ok)
	require.Equal(t, contextKey("tx"), key)
	require.Same(t, tx, value)
}

func TestFindSubscriberTxNeedsATransaction(t *testing.T) {
	t.Parallel()
	_, _, ok := testTx.find(context.Background())
	require.False(t, ok)
	// The key's type, holding something else: another of the package's
	// keys, or a nil transaction.
	ctx := context.WithValue(context.Background(), contextKey("delay"), time.Second)
	ctx = context.WithValue(ctx, contextKey("tx"), (*fakeTx)(nil))
	_, _, ok = testTx.find(ctx)
	require.False(t, ok)
	// Text is read from the key, not assumed.
	ctx = context.WithValue(ctx, contextKey("transaction"), &fakeTx{})
	key, _, ok := testTx.find(ctx)
	require.True(t, ok)
	require.Equal(t, contextKey("transaction"), key)
}

// wrapper has watermill-sql v4's shape: a struct around the transaction,
// in an exported field Tx, with fields of its own.
type wrapper struct {
	Tx    *fakeTx
	extra string
}

func (w wrapper) Commit() error   { return nil }
func (w wrapper) Rollback() error { return nil }

type other struct{}

func (other) Commit() error   { return nil }
func (other) Rollback() error { return nil }

func TestStandIn(t *testing.T) {
	t.Parallel()
	mine := &fakeTx{id: 9}

	direct, err := standIn(&fakeTx{id: 1}, mine)
	require.NoError(t, err)
	require.Same(t, mine, direct)

	orig := &wrapper{Tx: &fakeTx{id: 1}, extra: "kept"}
	ptr, err := standIn(orig, mine)
	require.NoError(t, err)
	got := ptr.(*wrapper)
	require.Same(t, mine, got.Tx)
	require.Equal(t, "kept", got.extra)
	require.NotSame(t, orig, got, "the subscriber's wrapper is left alone")
	require.Equal(t, 1, orig.Tx.id)

	val, err := standIn(wrapper{Tx: &fakeTx{id: 1}}, mine)
	require.NoError(t, err)
	require.Same(t, mine, val.(wrapper).Tx)

	// A concrete transaction fits a field of an interface type it
	// implements, as pgx's does pgx.Tx.
	type txIface interface{ Commit() error }
	type ifaceWrapper struct{ Tx txIface }
	iw, err := standIn(&ifaceWrapper{}, mine)
	require.NoError(t, err)
	require.Same(t, mine, iw.(*ifaceWrapper).Tx)

	for _, v := range []any{other{}, &wrapper{}} {
		_, err = standIn(v, custom{})
		require.True(t, errors.Is(err, ErrSubscriberTx), "%T: %v", v, err)
	}
}

// routerContext is a message context as a router hands it to middleware:
// the subscriber's values (a Kafka partition and offset, say, or
// watermill-sql's transaction under its deadline), then the router's five.
func routerContext(b *testing.B, subscriber func(context.Context) context.Context) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	ctx = subscriber(ctx)
	for _, k := range []string{"handler", "publisher", "subscriber", "subscribe_topic", "publish_topic"} {
		ctx = context.WithValue(ctx, routerKey(k), k)
	}
	return ctx
}

type routerKey string

// BenchmarkSubscriberTx measures what looking for a subscriber's
// transaction adds to each message, as a multiple of one ctx.Value lookup
// through the same context (the middleware makes several: handler name,
// publish topic): a full walk up the context for a message that carries none,
// a cached key's lookup for one that does.
//
//	go test -run '^$' -bench BenchmarkSubscriberTx -count 5 .
func BenchmarkSubscriberTx(b *testing.B) {
	plain := routerContext(b, func(ctx context.Context) context.Context {
		return context.WithValue(context.WithValue(ctx, routerKey("partition"), 3), routerKey("offset"), 42)
	})
	withTx := routerContext(b, func(ctx context.Context) context.Context {
		ctx, cancelDeadline := context.WithTimeout(ctx, time.Hour)
		b.Cleanup(cancelDeadline)
		ctx, cancel := context.WithCancel(context.WithValue(ctx, contextKey("tx"), &fakeTx{}))
		b.Cleanup(cancel)
		return ctx
	})
	// The baseline is timed here, in the same run (testing.Benchmark would
	// deadlock inside a benchmark).
	const lookups = 1_000_000
	start := time.Now()
	for range lookups {
		_ = plain.Value(routerKey("missing"))
	}
	baseline := float64(time.Since(start).Nanoseconds()) / lookups
	for _, c := range []struct {
		name  string
		ctx   context.Context
		found bool
	}{{"none", plain, false}, {"watermill-sql", withTx, true}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, _, ok := testTx.find(c.ctx); ok != c.found {
					b.Fatal("wrong answer")
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(baseline, "ns/ctx.Value")
			b.ReportMetric(perOp/baseline, "x_ctx.Value")
		})
	}
}

// The walk runs while other goroutines cancel the message's contexts (a
// subscriber closing, an ack deadline): it reads no field that cancel
// writes. Under -race this fails if it does.
func TestFindSubscriberTxWhileCancelled(t *testing.T) {
	t.Parallel()
	base := context.WithValue(context.Background(), contextKey("tx"), &fakeTx{})
	for range 200 {
		ctx, cancel := context.WithCancelCause(base)
		ctx, cancelTimeout := context.WithTimeout(ctx, time.Hour)
		done := make(chan struct{})
		go func() {
			cancel(errors.New("closing"))
			close(done)
		}()
		require.Len(t, contextKeys(ctx, isTestKey), 1)
		<-done
		cancelTimeout()
	}
}

// deepKey is a key type no other test stores, so that no earlier lookup
// has cached it.
type deepKey string

func isDeepKey(t reflect.Type) bool { return t == reflect.TypeFor[deepKey]() }

// A transaction stored far up the context, under a thousand values and
// more that a subscriber's caller or the application added, is found on the
// first message, before any key was cached.
func TestFindSubscriberTxDeepInTheContext(t *testing.T) {
	t.Parallel()
	tx := &fakeTx{id: 7}
	ctx := context.WithValue(context.Background(), deepKey("tx"), tx)
	for i := range 5000 {
		ctx = context.WithValue(ctx, routerKey("app"), i)
	}
	key, value, ok := (&txFinder{isKey: isDeepKey}).find(ctx)
	require.True(t, ok)
	require.Equal(t, deepKey("tx"), key)
	require.Same(t, tx, value)
}

// deepContext is a context with depth values of the application's, a
// subscriber's and the router's on top.
func deepContext(b *testing.B, depth int) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	for i := range depth {
		ctx = context.WithValue(ctx, routerKey("app"), i)
	}
	return ctx
}

// BenchmarkSubscriberTxDepth measures the look for a subscriber's
// transaction in a message that carries none, under an application's
// context of 5, 50 and 500 values: the same message again and again, and
// a new message each time (the subscriber's and the router's values on
// the application's context, as a subscriber of another broker hands them
// over).
//
//	go test -run '^$' -bench BenchmarkSubscriberTxDepth -count 5 .
//
// A new message costs about 1 µs at each depth, where walking the whole
// context cost 3.2, 12 and 132 µs (medians of five runs, 2026-12-01).
func BenchmarkSubscriberTxDepth(b *testing.B) {
	for _, depth := range []int{5, 50, 500} {
		base := deepContext(b, depth)
		messages := make([]context.Context, 1024)
		for i := range messages {
			messages[i] = routerContext(b, func(context.Context) context.Context {
				return context.WithValue(context.WithValue(base, routerKey("partition"), 3), routerKey("offset"), i)
			})
		}
		f := &txFinder{isKey: isTestKey}
		b.Run(fmt.Sprintf("depth=%d/same", depth), func(b *testing.B) {
			for b.Loop() {
				if _, _, ok := f.find(messages[0]); ok {
					b.Fatal("wrong answer")
				}
			}
		})
		b.Run(fmt.Sprintf("depth=%d/new", depth), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, _, ok := f.find(messages[i%len(messages)]); ok {
					b.Fatal("wrong answer")
				}
			}
		})
	}
}

// A context found clean stops the walk of later messages made on it, and
// hides nothing they add: a transaction above it is found, and one below
// it, under a context of another chain, too.
func TestFindSubscriberTxAfterACleanContext(t *testing.T) {
	t.Parallel()
	f := &txFinder{isKey: isTestKey}
	base := context.WithValue(context.Background(), routerKey("app"), 1)
	for i := range 100 {
		base = context.WithValue(base, routerKey("app"), i)
	}
	for i := range 3 {
		_, _, ok := f.find(context.WithValue(base, routerKey("offset"), i))
		require.False(t, ok)
	}
	tx := &fakeTx{id: 3}
	msg := context.WithValue(context.WithValue(base, contextKey("tx"), tx), routerKey("handler"), "h")
	_, value, ok := f.find(msg)
	require.True(t, ok)
	require.Same(t, tx, value)
	// The key is known now; a new finder still finds it by the walk.
	_, value, ok = (&txFinder{isKey: isTestKey}).find(msg)
	require.True(t, ok)
	require.Same(t, tx, value)
	// A clean context's answer does not leak to one of another chain.
	other := context.WithValue(context.WithValue(context.Background(), contextKey("tx"), tx), routerKey("app"), 1)
	_, _, ok = f.find(other)
	require.True(t, ok)
}
