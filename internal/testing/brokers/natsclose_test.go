package brokers_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testing/effects"
)

// closeSafeSubscriber is a watermill-nats (pkg/nats) subscriber that may
// close while JetStream is still delivering.
//
// watermill-nats v2.1.3 closes a subscription's output channel
// (subscriber.go:270) once nats.go's Unsubscribe returns, which does not wait
// for a callback in flight, while that callback may be sending a message to
// the channel (subscriber.go:339): go test -race reports a data race, and the
// send can panic on the closed channel. It happens whenever a message
// arrives as the subscriber closes: a redelivery after AckWait, a nacked
// message coming back at once, a late push from a new stream leader.
//
// This wrapper closes in an order that never lets a callback meet the
// channel's close. It subscribes with a context of its own, since the
// router cancels the one it passes as soon as it starts closing, and that
// alone closes the channel. When the router's context ends or Close is
// called, the unmarshaler first turns new deliveries away (watermill-nats
// then logs "Cannot unmarshal message" and returns before it touches the
// channel; without an ack JetStream delivers the message again after
// AckWait), then the wrapper waits until every delivery that was
// unmarshalled has reached the router, and only then ends the
// subscription. A service can wrap its subscriber the same way.
type closeSafeSubscriber struct {
	*wmnats.Subscriber
	gate         *deliveryGate
	closeTimeout time.Duration
}

func newCloseSafeSubscriber(config wmnats.SubscriberConfig) (*closeSafeSubscriber, error) {
	gate := &deliveryGate{next: config.Unmarshaler, shut: make(chan struct{})}
	if gate.next == nil {
		gate.next = &wmnats.NATSMarshaler{}
	}
	config.Unmarshaler = gate
	sub, err := wmnats.NewSubscriber(config, logger)
	if err != nil {
		return nil, err
	}
	return &closeSafeSubscriber{Subscriber: sub, gate: gate, closeTimeout: config.CloseTimeout}, nil
}

// Subscribe forwards the subscription's messages, counting each delivery
// the gate let through as arrived once the router has it. The subscription
// ends when ctx does, or at Close, once the gate is shut.
func (s *closeSafeSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	own, cancel := context.WithCancel(context.WithoutCancel(ctx))
	in, err := s.Subscriber.Subscribe(own, topic)
	if err != nil {
		cancel()
		return nil, err
	}
	out := make(chan *message.Message)
	go func() {
		defer close(out)
		for msg := range in {
			s.gate.arrived()
			out <- msg
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.gate.shut:
		}
		s.gate.close(s.closeTimeout)
		cancel()
	}()
	return out, nil
}

// Close shuts the gate, then closes the subscriber.
func (s *closeSafeSubscriber) Close() error {
	s.gate.close(s.closeTimeout)
	return s.Subscriber.Close()
}

// deliveryGate is the unmarshaler of a closeSafeSubscriber: it counts the
// deliveries on their way to the output channel, and refuses new ones once
// closed.
type deliveryGate struct {
	next wmnats.Unmarshaler

	mu       sync.Mutex
	closed   bool
	shut     chan struct{} // closed with closed
	underWay sync.WaitGroup
}

var errSubscriberClosing = errors.New("the subscriber is closing: JetStream delivers this message again after AckWait")

func (g *deliveryGate) Unmarshal(m *nats.Msg) (*message.Message, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, errSubscriberClosing
	}
	g.underWay.Add(1)
	g.mu.Unlock()
	msg, err := g.next.Unmarshal(m)
	if err != nil {
		g.underWay.Done() // watermill-nats drops it before the channel
	}
	return msg, err
}

// arrived records that a delivery reached the router: its send on the
// output channel is over.
func (g *deliveryGate) arrived() { g.underWay.Done() }

// close turns new deliveries away and waits for those under way, at most
// timeout (a router that stopped reading never takes them).
func (g *deliveryGate) close(timeout time.Duration) {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		close(g.shut)
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		g.underWay.Wait()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// A subscriber closed while JetStream delivers nacked messages again and
// again: without closeSafeSubscriber go test -race fails here nearly every
// run (watermill-nats v2.1.3 closes the output channel under a callback's
// send).
func TestNATSSubscriberClosesWhileDelivering(t *testing.T) {
	t.Parallel()
	for range 20 {
		stream := natsStream(t, natsURL(), 1)
		effects.PublishEvents(t, natsPublisher(t, natsURL()), stream, 5)
		sub := natsSubscriber(t, natsURL(), time.Second, 2)
		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: effects.WaitFor}, logger)
		require.NoError(t, err)
		var nacked atomic.Int64
		router.AddConsumerHandler("nacks", stream, sub, func(*message.Message) error {
			nacked.Add(1)
			return errors.New("nacked: JetStream delivers it again at once")
		})
		done := make(chan error, 1)
		go func() { done <- router.Run(context.Background()) }()
		<-router.Running()
		require.Eventually(t, func() bool { return nacked.Load() >= 5 }, effects.WaitFor, 10*time.Millisecond, "deliveries go on")
		time.Sleep(100 * time.Millisecond) // closing amid a stream of deliveries, not between two
		require.NoError(t, router.Close())
		require.NoError(t, <-done)
	}
}
