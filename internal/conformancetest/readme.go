package conformancetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
)

// ReadmeRetries is the README stack's Retry.MaxRetries.
const ReadmeRetries = 3

// ReadmeStack is a router on an in-memory pub/sub, which redelivers a
// nacked message at once, behind the README's stack: PoisonQueue for what
// is not transient, Retry ([ReadmeRetries]) for what is not permanent,
// Recoverer, Backoff, and the inbox around the handler.
type ReadmeStack struct {
	pubSub *gochannel.GoChannel

	mu       sync.Mutex
	poisoned []string // the reason of each poisoned message
	returned []error  // what the inbox returned, attempt by attempt
}

// NewReadmeStack runs h behind mw in the README's stack, for consumer
// "billing", until the test ends. The router and Backoff log to logger.
func NewReadmeStack(t *testing.T, mw message.HandlerMiddleware, backoff inbox.BackoffConfig, logger watermill.LoggerAdapter, h message.NoPublishHandlerFunc) *ReadmeStack {
	t.Helper()
	s := &ReadmeStack{pubSub: pubsub()}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: time.Second}, logger)
	require.NoError(t, err)
	poison, err := middleware.PoisonQueueWithFilter(s.pubSub, "poisoned", func(err error) bool { return !inbox.IsTransient(err) })
	require.NoError(t, err)
	wait, err := inbox.NewBackoff(backoff, logger)
	require.NoError(t, err)
	router.AddMiddleware(
		poison,
		middleware.Retry{MaxRetries: ReadmeRetries, InitialInterval: 10 * time.Millisecond,
			ShouldRetry: func(p middleware.RetryParams) bool { return !inbox.IsPermanent(p.Err) }}.Middleware,
		middleware.Recoverer,
		wait,
		s.record,
	)
	router.AddConsumerHandler("billing", "orders", s.pubSub, inbox.ConsumerHandler(mw, h))
	poisoned, err := s.pubSub.Subscribe(context.Background(), "poisoned")
	require.NoError(t, err)
	go func() {
		for msg := range poisoned {
			s.mu.Lock()
			s.poisoned = append(s.poisoned, msg.Metadata.Get(middleware.ReasonForPoisonedKey))
			s.mu.Unlock()
			msg.Ack()
		}
	}()
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	t.Cleanup(func() { _ = router.Close(); _ = s.pubSub.Close() })
	return s
}

// record keeps what the inbox returns.
func (s *ReadmeStack) record(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		produced, err := h(msg)
		s.mu.Lock()
		s.returned = append(s.returned, err)
		s.mu.Unlock()
		return produced, err
	}
}

// Deliver publishes msg and returns once it is acked, processed or
// poisoned. A message redelivered in a loop fails the test after 10 s.
func (s *ReadmeStack) Deliver(t *testing.T, msg *message.Message) {
	t.Helper()
	s.DeliverWithin(t, msg, 10*time.Second)
}

// DeliverWithin is [ReadmeStack.Deliver] with another bound.
func (s *ReadmeStack) DeliverWithin(t *testing.T, msg *message.Message, within time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.pubSub.Publish("orders", msg) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(within):
		t.Fatalf("event %s not acked within %s: redelivered in a loop, never poisoned", msg.Metadata.Get(inbox.DefaultEventIDMetadataKey), within)
	}
}

// Poisoned returns the reason of each poisoned message.
func (s *ReadmeStack) Poisoned() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.poisoned...)
}

// Returned returns what the inbox returned, attempt by attempt, nil for
// success.
func (s *ReadmeStack) Returned() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.returned...)
}
