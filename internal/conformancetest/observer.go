package conformancetest

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

// panickingObserver panics in Start, or in its done callback, on every
// message.
type panickingObserver struct{ inStart bool }

func (p panickingObserver) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	if p.inStart {
		panic("observer Start exploded")
	}
	return ctx, func(observe.Observation) { panic("observer done exploded") }
}

// lastObservation keeps the observation of the last message.
type lastObservation struct {
	mu sync.Mutex
	ob observe.Observation
	n  int
}

func (l *lastObservation) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	return ctx, func(ob observe.Observation) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.ob, l.n = ob, l.n+1
	}
}

// An observer that panics on every message, in Start or in its done
// callback, changes nothing: each event's effect commits once, the messages
// its handler returns reach the router's publisher exactly once (without
// ProducedPublisher the router publishes them after the middleware
// returns, so a panic after the commit used to lose them), every
// redelivery is acked as a duplicate, and another observer combined with
// it sees every message with the panics counted.
func testObserverPanics(t *testing.T, target Target) {
	for _, inStart := range []bool{true, false} {
		t.Run(map[bool]string{true: "Start", false: "done"}[inStart], func(t *testing.T) {
			b := setup(t, target)
			ps := pubsub()
			produced := Payloads(t, ps, "out")
			last := &lastObservation{}
			RunRouter(t, func(r *message.Router) {
				r.AddMiddleware(middleware.Recoverer, b.middleware(t, inbox.Config{
					Observer: observe.Join(last, panickingObserver{inStart: inStart}),
				}))
				r.AddHandler("billing", "events", ps, "out", ps, func(msg *message.Message) ([]*message.Message, error) {
					if err := b.writeEffect(msg); err != nil {
						return nil, err
					}
					id, _, _ := inbox.EventIDFromContext(msg.Context())
					return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(id))}, nil
				})
			})
			events := ids("ev", 3)
			for range 3 {
				for _, id := range events {
					PublishWithin(t, ps, "events", newMsg(id))
				}
			}
			// Publish returned once the router acked, after it had
			// published the produced messages, which the subscriber
			// above acked first.
			require.ElementsMatch(t, events, produced(), "each event's produced message, once")
			require.Equal(t, once("billing", events...), b.effectCounts(t))
			require.Equal(t, len(events), b.claims(t))
			last.mu.Lock()
			defer last.mu.Unlock()
			require.Equal(t, 9, last.n, "the other observer sees every delivery")
			require.Equal(t, observe.Duplicate, last.ob.Outcome)
			require.EqualValues(t, 9, last.ob.ObserverPanics, "every panic counted, this message's included")
		})
	}
}

// Payloads subscribes to topic and acks every message; the function it
// returns lists the payloads received so far.
func Payloads(t testing.TB, sub message.Subscriber, topic string) func() []string {
	t.Helper()
	var (
		mu       sync.Mutex
		payloads []string
	)
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	go func() {
		for m := range msgs {
			mu.Lock()
			payloads = append(payloads, string(m.Payload))
			mu.Unlock()
			m.Ack()
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(payloads)
	}
}
