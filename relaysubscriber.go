package inbox

import (
	"context"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// RelaySubscriber wraps the subscriber of an outbox relay so that Close
// first ends every subscription's context, then closes sub.
//
// watermill-sql v4.1's subscriber reads a batch of rows in one transaction
// and, closed while it delivers them, still runs its ack query with every
// row of the batch and commits: the queue schema then deletes the rows it
// never delivered. A Watermill router, a forwarder and the signals plugin
// all stop a subscriber with Close. With the subscription's context ended
// first, database/sql refuses any statement or commit in the transaction
// begun with it, so the batch rolls back and its rows are published again
// (duplicates the next inbox drops). Ending the context given to Run or
// Subscribe has the same effect without this wrapper.
//
// It does not cover AckDeadline: set it to 0 on such a relay, since a message
// held past it makes the subscriber ack the rest of the batch the same way.
func RelaySubscriber(sub message.Subscriber) message.Subscriber {
	return &relaySubscriber{Subscriber: sub, cancels: map[*context.CancelFunc]struct{}{}}
}

type relaySubscriber struct {
	message.Subscriber
	mu      sync.Mutex
	closed  bool
	cancels map[*context.CancelFunc]struct{}
}

func (s *relaySubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		cancel()
		return s.Subscriber.Subscribe(ctx, topic) // the closed subscriber's own error
	}
	s.cancels[&cancel] = struct{}{}
	s.mu.Unlock()
	ch, err := s.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		s.forget(&cancel)
	}
	return ch, err
}

func (s *relaySubscriber) forget(cancel *context.CancelFunc) {
	s.mu.Lock()
	delete(s.cancels, cancel)
	s.mu.Unlock()
	(*cancel)()
}

// Close ends every subscription's context, then closes the subscriber.
func (s *relaySubscriber) Close() error {
	s.mu.Lock()
	s.closed = true
	for cancel := range s.cancels {
		(*cancel)()
	}
	clear(s.cancels)
	s.mu.Unlock()
	return s.Subscriber.Close()
}
