package inbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
)

// Two handler names on one topic, each getting every message (gochannel),
// wired as users do. The same function under both is taken for workers of
// one queue: refused under the default consumer (transiently, logged once),
// one claim under a fixed consumer. Two function values (two literals, or
// one made twice) are a fan-out: each runs every event.
// Router.AddConsumerHandler hides the function, so its handlers go
// unchecked.
func TestWorkersOfOneFunction(t *testing.T) {
	t.Parallel()
	type add func(r *message.Router, mw message.HandlerMiddleware, w *wiring)
	same := func(r *message.Router, mw message.HandlerMiddleware, w *wiring) {
		h := w.handler(nil)
		r.AddMiddleware(mw)
		r.AddHandler("orders-1", "orders", w.ps, "", nil, h)
		r.AddHandler("orders-2", "orders", w.ps, "", nil, h)
	}
	for _, tc := range []struct {
		name     string
		consumer string
		add      add
		effects  int // per event
		refused  bool
	}{
		{"same function, default consumer", "", same, 0, true},
		{"same function through inbox.Handler, default consumer", "", func(r *message.Router, mw message.HandlerMiddleware, w *wiring) {
			h := w.handler(nil)
			r.AddHandler("orders-1", "orders", w.ps, "", nil, inbox.Handler(mw, h))
			r.AddHandler("orders-2", "orders", w.ps, "", nil, inbox.Handler(mw, h))
		}, 0, true},
		{"same function, fixed consumer", "orders", same, 1, false},
		{"two functions, default consumer", "", func(r *message.Router, mw message.HandlerMiddleware, w *wiring) {
			h := w.handler(nil)
			r.AddMiddleware(mw)
			r.AddHandler("invoicing", "orders", w.ps, "", nil, func(msg *message.Message) ([]*message.Message, error) { return h(msg) })
			r.AddHandler("analytics", "orders", w.ps, "", nil, func(msg *message.Message) ([]*message.Message, error) { return h(msg) })
		}, 2, false},
		{"one function literal made twice, default consumer", "", func(r *message.Router, mw message.HandlerMiddleware, w *wiring) {
			h := w.handler(nil)
			for _, name := range []string{"invoicing", "analytics"} {
				r.AddConsumerHandler(name, "orders", w.ps, inbox.ConsumerHandler(mw, func(msg *message.Message) error { _, err := h(msg); return err }))
			}
		}, 2, false},
		{"two functions through inbox.ConsumerHandler", "", func(r *message.Router, mw message.HandlerMiddleware, w *wiring) {
			h := w.handler(nil)
			r.AddConsumerHandler("invoicing", "orders", w.ps, inbox.ConsumerHandler(mw, func(msg *message.Message) error { _, err := h(msg); return err }))
			r.AddConsumerHandler("analytics", "orders", w.ps, inbox.ConsumerHandler(mw, func(msg *message.Message) error { _, err := h(msg); return err }))
		}, 2, false},
		{"same function through Router.AddConsumerHandler", "", func(r *message.Router, mw message.HandlerMiddleware, w *wiring) {
			h := w.handler(nil)
			f := func(msg *message.Message) error { _, err := h(msg); return err }
			r.AddMiddleware(mw)
			r.AddConsumerHandler("orders-1", "orders", w.ps, f)
			r.AddConsumerHandler("orders-2", "orders", w.ps, f)
		}, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := newWiring(t)
			errs := make(chan error, 10)
			mw := w.middleware(t, inbox.Config{Consumer: tc.consumer})
			conformancetest.RunRouter(t, func(r *message.Router) {
				r.AddMiddleware(conformancetest.ErrorsTo(errs))
				tc.add(r, mw, w)
			})
			// The first copy may run before the second name is seen.
			w.publish(t, "orders", "first")
			before := w.effects(t)
			w.publish(t, "orders", "a", "b")
			close(errs)
			var refusals int
			for err := range errs {
				require.True(t, inbox.IsTransient(err), "%v", err)
				require.False(t, errors.Is(err, inbox.ErrMiswired), "never poisoned: %v", err)
				require.ErrorContains(t, err, `2 handler names run one function on topic "orders"; use inbox.Subscriptions, or Consumer with ShareConsumer`)
				refusals++
			}
			require.Equal(t, 2*tc.effects, w.effects(t)-before)
			if !tc.refused {
				require.Zero(t, refusals)
				require.Empty(t, w.errorLogs())
				require.Empty(t, w.warningLogs())
				return
			}
			require.LessOrEqual(t, before, 1)
			require.Equal(t, 6-before, refusals, "every copy but one that ran before the second name was seen")
			require.Len(t, w.errorLogs(), 1)
			require.Equal(t, "orders-1, orders-2", w.errorLogs()[0].Fields["handlers"])
		})
	}
}

// Subscriptions merges n subscriptions into one channel, closed once the
// subscriptions are, and closes the subscriber it wraps.
func TestSubscriptions(t *testing.T) {
	t.Parallel()
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	sub := inbox.Subscriptions(ps, 3)
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)
	require.NoError(t, ps.Publish("orders", message.NewMessage("a", nil)))
	for range 3 { // gochannel gives each subscription every message
		select {
		case msg := <-msgs:
			require.Equal(t, "a", msg.UUID)
			msg.Ack()
		case <-time.After(10 * time.Second):
			t.Fatal("a subscription's copy did not arrive")
		}
	}
	cancel()
	for range msgs {
	}
	require.NoError(t, sub.Close())
	require.ErrorContains(t, ps.Publish("orders", message.NewMessage("b", nil)), "closed")
}
