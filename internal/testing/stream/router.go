package stream

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
)

// Consumer is the inbox consumer of every router of a stream.
const Consumer = "stream"

// NackResendSleep is how long the Kafka subscriber waits before it
// redelivers a nacked message (watermill-kafka's default).
const NackResendSleep = 100 * time.Millisecond

// Retry is the router setting that keeps a router calm while its database
// is down: each message is retried in place with exponential backoff (0.1 s
// doubling up to 2 s), outside the inbox so that every attempt opens a new
// transaction; when the retries give up, the router nacks and the
// subscriber redelivers after NackResendSleep.
func Retry(c *Counts) middleware.Retry {
	return middleware.Retry{
		MaxRetries:          10,
		InitialInterval:     100 * time.Millisecond,
		MaxInterval:         2 * time.Second,
		Multiplier:          2,
		RandomizationFactor: 0.2,
		OnRetryHook:         func(int, time.Duration) { c.Retries.Add(1) },
		Logger:              c.Logger(),
	}
}

// JoinOption changes a router Join starts.
type JoinOption func(*joinConfig)

type joinConfig struct {
	retry bool
	stack []message.HandlerMiddleware // nil: Retry, or nothing
}

// WithoutRetry leaves the Retry middleware out: a failed message is nacked
// at once, and the subscriber redelivers it after NackResendSleep.
func WithoutRetry() JoinOption { return func(c *joinConfig) { c.retry = false } }

// WithStack puts mws, outermost first, between the router and the inbox in
// place of the Retry middleware, and the inbox around the handler function
// (inbox.ConsumerHandler), as the recommended stack wires them.
func WithStack(mws ...message.HandlerMiddleware) JoinOption {
	return func(c *joinConfig) { c.stack = mws }
}

// Join starts a router that consumes the stream in its group, behind the
// Retry middleware and the inbox on tg, and writes one effect per handled
// message. It stops when the returned function is called or the test ends.
func (s *Stream) Join(t testing.TB, tg *Target, c *Counts, opts ...JoinOption) (stop func()) {
	t.Helper()
	jc := joinConfig{retry: true}
	for _, o := range opts {
		o(&jc)
	}
	logger := c.Logger()
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               s.Addrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: kafkatest.SubscriberConfig(kafkatest.SessionTimeout),
		ConsumerGroup:         s.Group,
		NackResendSleep:       NackResendSleep,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, logger)
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	require.NoError(t, err)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: tg.Store, Consumer: Consumer, Observer: c, Logger: logger})
	require.NoError(t, err)
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			c.Deliveries.Add(1)
			out, err := h(msg)
			if err != nil {
				c.Nacks.Add(1)
			}
			return out, err
		}
	}
	handler := func(msg *message.Message) error {
		id, _, _ := inbox.EventIDFromContext(msg.Context())
		return tg.WriteEffect(msg.Context(), id)
	}
	mws := []message.HandlerMiddleware{count, Retry(c).Middleware, mw}
	switch {
	case jc.stack != nil:
		mws = append([]message.HandlerMiddleware{count}, jc.stack...)
		handler = inbox.ConsumerHandler(mw, handler)
	case !jc.retry:
		mws = []message.HandlerMiddleware{count, mw}
	}
	router.AddConsumerHandler(Consumer, s.Topic, sub, handler).AddMiddleware(mws...)

	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("the router stopped at start: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}
