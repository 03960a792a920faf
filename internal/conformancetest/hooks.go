package conformancetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

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
type observed struct{ ob observe.Observation }

func (o *observed) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) { o.ob = ob }
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
	require.Equal(t, observe.Processed, obs.ob.Outcome)
	require.NoError(t, obs.ob.Err)
	require.ErrorContains(t, obs.ob.AfterCommitErr, "after-commit hook panicked: hook exploded")
	require.ErrorContains(t, obs.ob.AfterCommitErr, "hook failed")
	require.Equal(t, once("c", "a"), b.effectCounts(t))

	_, err = call(mw, h, newMsg("a"))
	require.NoError(t, err)
	require.Equal(t, observe.Duplicate, obs.ob.Outcome)
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
