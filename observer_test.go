package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

type recorder struct {
	mu  sync.Mutex
	obs []observe.Observation
}

type ctxMark struct{}

func (r *recorder) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return context.WithValue(ctx, ctxMark{}, true), func(ob observe.Observation) {
		r.mu.Lock()
		r.obs = append(r.obs, ob)
		r.mu.Unlock()
	}
}

func (r *recorder) outcomes() []observe.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]observe.Outcome, len(r.obs))
	for i, ob := range r.obs {
		out[i] = ob.Outcome
	}
	return out
}

func TestObserverSeesEveryOutcome(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	rec := &recorder{}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c", Observer: observe.Join(rec)})
	require.NoError(t, err)

	msg := func(id string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), nil)
		if id != "" {
			m.Metadata.Set("event_id", id)
		}
		return m
	}
	ok := func(msg *message.Message) ([]*message.Message, error) {
		require.Equal(t, true, msg.Context().Value(ctxMark{}), "the observer's context reaches the handler")
		return nil, nil
	}
	boom := errors.New("boom")
	fail := func(*message.Message) ([]*message.Message, error) { return nil, boom }

	_, err = mw(ok)(msg("a"))
	require.NoError(t, err)
	_, err = mw(ok)(msg("a"))
	require.NoError(t, err)
	_, err = mw(ok)(msg("a\x00"))
	require.Error(t, err)
	noID := message.NewMessage("", nil)
	_, err = mw(ok)(noID)
	require.Error(t, err)
	_, err = mw(fail)(msg("b"))
	require.ErrorIs(t, err, boom)
	require.Panics(t, func() {
		_, _ = mw(func(*message.Message) ([]*message.Message, error) { panic("p") })(msg("c"))
	})

	require.Equal(t, []observe.Outcome{
		observe.Processed, observe.Duplicate, observe.InvalidID, observe.MissingID,
		observe.RolledBack, observe.RolledBack,
	}, rec.outcomes())
	first := rec.obs[0]
	require.Equal(t, "c", first.Consumer)
	require.Equal(t, "a", first.EventID)
	require.Positive(t, first.ClaimDuration)
	require.GreaterOrEqual(t, first.Duration, first.ClaimDuration)
	require.ErrorIs(t, rec.obs[4].Err, boom)

	require.NoError(t, db.Close())
	_, err = mw(ok)(msg("d"))
	require.Error(t, err)
	require.Equal(t, observe.ClaimFailed, rec.outcomes()[6])
}

// panicky panics in Start for the handlers in start, and in its done
// callback for the others.
type panicky struct{ start map[string]bool }

func (p panicky) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	if p.start[message.HandlerNameFromCtx(ctx)] {
		panic("Start exploded")
	}
	return ctx, func(observe.Observation) { panic("done exploded") }
}

// A lone observer that panics in Start or in done changes nothing for the
// message: the middleware returns the handler's produced messages to the
// router, acks duplicates, nacks failures, as without it. The first panic
// of each consumer is logged at error level, once.
func TestObserverPanicChangesNothing(t *testing.T) {
	t.Parallel()
	w := newWiring(t)
	produced := conformancetest.Payloads(t, w.ps, "out")
	var failures atomic.Int64
	conformancetest.RunRouter(t, func(r *message.Router) {
		r.AddMiddleware(middleware.Recoverer, w.middleware(t, inbox.Config{Observer: panicky{start: map[string]bool{"starts": true}}}))
		for _, name := range []string{"starts", "dones"} {
			r.AddHandler(name, name, w.ps, "out", w.ps, func(msg *message.Message) ([]*message.Message, error) {
				_, err := w.handler(func(attempt int) error {
					if msg.Metadata.Get("fail") != "" && attempt == 1 {
						failures.Add(1)
						return errors.New("first attempt fails")
					}
					return nil
				})(msg)
				if err != nil {
					return nil, err
				}
				return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(name))}, nil
			})
		}
	})
	for _, name := range []string{"starts", "dones"} {
		w.publish(t, name, "a", "a")
		failing := message.NewMessage(watermill.NewUUID(), nil)
		failing.Metadata.Set(inbox.DefaultEventIDMetadataKey, "b")
		failing.Metadata.Set("fail", "yes")
		conformancetest.PublishWithin(t, w.ps, name, failing)
	}
	require.EqualValues(t, 2, failures.Load(), "each failed attempt was nacked and redelivered")
	require.ElementsMatch(t, []string{"starts", "starts", "dones", "dones"}, produced(), "one produced message per event")
	require.Equal(t, 4, w.effects(t))
	require.Equal(t, 4, w.claims(t))
	var logged []watermill.CapturedMessage
	for _, l := range w.logs.Captured()[watermill.ErrorLogLevel] {
		if l.Fields["kind"] == nil { // not the failed handler's trace
			logged = append(logged, l)
		}
	}
	require.Len(t, logged, 2, "once per consumer")
	for i, callback := range []string{"Start", "done"} {
		require.Contains(t, logged[i].Msg, "an observer panicked")
		require.Equal(t, callback, logged[i].Fields["callback"])
		require.ErrorContains(t, logged[i].Err, callback+" exploded")
	}
}
