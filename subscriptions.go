package inbox

import (
	"context"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Subscriptions returns a subscriber whose Subscribe opens n subscriptions of
// sub on the topic and merges them into one channel: one router handler,
// hence one consumer, with up to n messages in flight on subscribers that
// deliver a subscription's next message only once the previous one is acked
// (Watermill's AMQP, NATS and Redis Streams subscribers). It is the way to
// scale a handler on one queue: the same handler added under several names
// would be several consumers (docs/wiring.md#workers). Not for a subscriber
// whose subscriptions each get every message (gochannel). Close closes sub.
func Subscriptions(sub message.Subscriber, n int) message.Subscriber {
	return subscriptions{sub: sub, n: max(n, 1)}
}

type subscriptions struct {
	sub message.Subscriber
	n   int
}

func (s subscriptions) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	return subscribeN(ctx, s.sub, topic, s.n)
}

func (s subscriptions) Close() error { return s.sub.Close() }

// subscribeN subscribes n times to topic and merges the subscriptions into
// one channel, closed once all of them are. A message the merged channel's
// reader no longer takes (ctx done) is nacked, for the broker to redeliver.
func subscribeN(ctx context.Context, sub message.Subscriber, topic string, n int) (<-chan *message.Message, error) {
	if n == 1 {
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("inbox: subscribing to %s: %w", topic, err)
		}
		return msgs, nil
	}
	tagged, err := subscribeTagged(ctx, sub, topic, n)
	if err != nil {
		return nil, err
	}
	merged := make(chan *message.Message)
	go func() {
		defer close(merged)
		for d := range tagged {
			select {
			case merged <- d.msg:
			case <-ctx.Done():
				d.msg.Nack()
			}
		}
	}()
	return merged, nil
}

// delivery is a message and the index of the subscription it came from.
type delivery struct {
	msg  *message.Message
	from int
}

// subscribeTagged is subscribeN telling each message's subscription.
func subscribeTagged(ctx context.Context, sub message.Subscriber, topic string, n int) (<-chan delivery, error) {
	merged := make(chan delivery)
	var wg sync.WaitGroup
	for i := range n {
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			return nil, fmt.Errorf("inbox: subscribing to %s (subscription %d of %d): %w", topic, i+1, n, err)
		}
		wg.Go(func() {
			for msg := range msgs {
				select {
				case merged <- delivery{msg, i}:
				case <-ctx.Done():
					msg.Nack()
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(merged)
	}()
	return merged, nil
}

var _ message.Subscriber = subscriptions{}
