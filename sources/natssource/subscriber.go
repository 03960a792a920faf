// Package natssource is a NATS JetStream subscriber that fills the batches
// of an [inbox.BatchConsumer]: it pulls from a durable consumer that keeps
// up to [Config.MaxAckPending] messages unacked, where Watermill's NATS
// subscriber hands a subscription's next message over only once the
// previous one is acked, so a batch from it holds one message.
//
// A message is acked when the inbox acks it (after its batch committed, or
// as a duplicate) and naked when it is nacked; JetStream redelivers what is
// neither within [Config.AckWait] (a crash, a lost connection), and the
// inbox turns what committed into duplicates. Messages are read with
// watermill-nats's NATSMarshaler, so a watermill-nats JetStream publisher
// publishes to it.
//
// It is a module of its own so that the inbox module needs no broker
// client.
package natssource

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/handover"
)

// Defaults of [Config].
const (
	// DefaultMaxAckPending is two batches of [inbox.DefaultMaxBatchSize],
	// so that the next batch is on its way while the previous one commits.
	DefaultMaxAckPending = 2 * inbox.DefaultMaxBatchSize
	DefaultAckWait       = 30 * time.Second
)

// Config configures [NewSubscriber].
type Config struct {
	// URL is the NATS URL, as nats://localhost:4222. Required.
	URL string

	// NatsOptions are the connection's options.
	NatsOptions []nats.Option

	// Durable names the durable pull consumer, created on the stream
	// that holds the topic's subject if missing; replicas share it, and
	// so its messages. Required.
	Durable string

	// MaxAckPending is how many messages the durable keeps unacked, over
	// all its replicas; a batch can hold no more. At least replicas times
	// [inbox.BatchConfig.MaxSize]. Defaults to [DefaultMaxAckPending].
	MaxAckPending int

	// AckWait is how long JetStream waits for an ack before it delivers a
	// message again: keep it above a batch's MaxWait and transaction.
	// Defaults to [DefaultAckWait].
	AckWait time.Duration

	// Unmarshaler reads messages. Defaults to watermill-nats's
	// NATSMarshaler.
	Unmarshaler wmnats.Unmarshaler

	// Logger receives a line per message the unmarshaler cannot read and
	// per failed ack. Defaults to [watermill.NopLogger].
	Logger watermill.LoggerAdapter
}

// Subscriber pulls from JetStream over one connection. It implements
// [message.Subscriber].
type Subscriber struct {
	config  Config
	nc      *nats.Conn
	js      jetstream.JetStream
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// ManyUnacked is [Config.MaxAckPending]: it tells
// [inbox.BatchConsumer.Run] that one subscription fills a batch.
func (s *Subscriber) ManyUnacked() int { return s.config.MaxAckPending }

// NewSubscriber connects to NATS.
func NewSubscriber(config Config) (*Subscriber, error) {
	if config.MaxAckPending == 0 {
		config.MaxAckPending = DefaultMaxAckPending
	}
	if config.AckWait == 0 {
		config.AckWait = DefaultAckWait
	}
	if config.Unmarshaler == nil {
		config.Unmarshaler = &wmnats.NATSMarshaler{}
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	switch {
	case config.URL == "":
		return nil, errors.New("natssource: URL is required")
	case config.Durable == "":
		return nil, errors.New("natssource: Durable is required")
	case config.MaxAckPending < 0 || config.AckWait < 0:
		return nil, fmt.Errorf("natssource: MaxAckPending (%d) and AckWait (%s) must not be negative", config.MaxAckPending, config.AckWait)
	}
	nc, err := nats.Connect(config.URL, config.NatsOptions...)
	if err != nil {
		return nil, fmt.Errorf("natssource: connecting: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("natssource: %w", err)
	}
	return &Subscriber{config: config, nc: nc, js: js, closing: make(chan struct{})}, nil
}

// Subscribe pulls the messages of subject topic through the durable
// consumer, which it creates or updates on the stream holding topic. The
// returned channel closes when ctx ends, the subscriber is closed or its
// connection closes.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, errors.New("natssource: subscriber closed")
	default:
	}
	stream, err := s.js.StreamNameBySubject(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("natssource: finding the stream of %s: %w", topic, err)
	}
	cons, err := s.js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable: s.config.Durable, FilterSubject: topic, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: s.config.AckWait, MaxAckPending: s.config.MaxAckPending,
	})
	if err != nil {
		return nil, fmt.Errorf("natssource: creating consumer %s on stream %s: %w", s.config.Durable, stream, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(s.config.MaxAckPending))
	if err != nil {
		return nil, fmt.Errorf("natssource: pulling from %s: %w", s.config.Durable, err)
	}
	out := make(chan *message.Message)
	sub := subscription{s: s, ctx: ctx, out: out, fields: watermill.LogFields{"topic": topic, "durable": s.config.Durable}}
	s.wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
		}
		it.Stop()
	})
	s.wg.Go(func() {
		defer close(out)
		sub.run(it)
	})
	return out, nil
}

// Close stops every subscription and closes the connection; JetStream
// redelivers what was not acked after AckWait.
func (s *Subscriber) Close() error {
	s.once.Do(func() {
		close(s.closing)
		s.wg.Wait()
		s.nc.Close()
	})
	return nil
}

// subscription hands one pull's messages to its consumer.
type subscription struct {
	s      *Subscriber
	ctx    context.Context
	out    chan *message.Message
	fields watermill.LogFields
	acks   sync.WaitGroup
}

// run hands every message over without waiting for its ack, until the
// pull stops; it returns once every message handed over is settled or can
// no longer be.
func (sub *subscription) run(it jetstream.MessagesContext) {
	defer sub.acks.Wait()
	for {
		m, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, nats.ErrConnectionClosed) {
			return
		}
		if err != nil {
			sub.s.config.Logger.Error("natssource: pulling", err, sub.fields)
			continue
		}
		if !sub.handOver(m) {
			return
		}
	}
}

// handOver sends m's message to the consumer and settles m once the
// message is; false when the consumer is gone. A message left unsettled
// is delivered again after AckWait.
func (sub *subscription) handOver(m jetstream.Msg) bool {
	msg, err := sub.s.config.Unmarshaler.Unmarshal(&nats.Msg{Subject: m.Subject(), Data: m.Data(), Header: m.Headers()})
	if err != nil {
		// Naked, it would come back at once, forever: terminated, JetStream
		// keeps it in the stream and sends a MSG_TERMINATED advisory.
		sub.s.config.Logger.Error("natssource: unreadable message terminated", err, sub.fields)
		sub.settle(m.Term())
		return true
	}
	return handover.Deliver(sub.ctx, sub.s.closing, sub.out, msg, handover.Delivery{Ack: m.Ack, Nack: m.Nak}, &sub.acks, sub.settle)
}

// settle logs an ack or nak that failed: JetStream redelivers the message
// after AckWait.
func (sub *subscription) settle(err error) {
	if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		sub.s.config.Logger.Error("natssource: settling a message", err, sub.fields)
	}
}

var _ inbox.ManyUnacked = (*Subscriber)(nil)
