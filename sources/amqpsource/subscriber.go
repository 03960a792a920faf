// Package amqpsource is a RabbitMQ subscriber that fills the batches of an
// [inbox.BatchConsumer]: it keeps up to [Config.Prefetch] deliveries per
// subscription unacked (basic.qos), where Watermill's AMQP subscriber
// delivers a subscription's next message only once the previous one is
// acked, so a batch from it holds one message per subscription.
//
// A delivery is acked when its message is (after its batch committed, or
// as a duplicate), and nacked with requeue when its message is nacked; a
// delivery unacked when its channel closes (a crash, a lost connection) is
// requeued by RabbitMQ, and the inbox turns what committed into
// duplicates. Its queues are declared as watermill-amqp's
// NewDurableQueueConfig declares them, and its messages unmarshaled by the
// same marshaler, so a watermill-amqp publisher publishes to it.
//
// It is a module of its own so that the inbox module needs no broker
// client.
package amqpsource

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/handover"
)

// DefaultPrefetch is [Config.Prefetch]'s default: two batches of
// [inbox.DefaultMaxBatchSize], so that the next batch is on its way while
// the previous one commits.
const DefaultPrefetch = 2 * inbox.DefaultMaxBatchSize

// Config configures [NewSubscriber].
type Config struct {
	// URL is the AMQP URI, as amqp://guest:guest@localhost:5672/.
	// Required.
	URL string

	// Prefetch is how many deliveries a subscription keeps unacked; a
	// batch can hold no more. At least [inbox.BatchConfig.MaxSize].
	// Defaults to [DefaultPrefetch].
	Prefetch int

	// QueueArguments are the arguments the queue is declared with (as
	// x-dead-letter-exchange, which keeps the messages the marshaler
	// cannot read); they must match those of the queue if it exists.
	// Defaults to none, as watermill-amqp's NewDurableQueueConfig.
	QueueArguments amqp.Table

	// Marshaler reads deliveries. Defaults to watermill-amqp's
	// DefaultMarshaler.
	Marshaler wamqp.Marshaler

	// Logger receives a line per delivery the marshaler cannot read and
	// per failed ack. Defaults to [watermill.NopLogger].
	Logger watermill.LoggerAdapter
}

// Subscriber subscribes to RabbitMQ queues over one connection, a channel
// per subscription. It implements [message.Subscriber].
type Subscriber struct {
	config  Config
	conn    *amqp.Connection
	closing chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

// ManyUnacked is [Config.Prefetch]: it tells [inbox.BatchConsumer.Run] that
// one subscription fills a batch.
func (s *Subscriber) ManyUnacked() int { return s.config.Prefetch }

// NewSubscriber connects to RabbitMQ.
func NewSubscriber(config Config) (*Subscriber, error) {
	if config.Prefetch == 0 {
		config.Prefetch = DefaultPrefetch
	}
	if config.Marshaler == nil {
		config.Marshaler = wamqp.DefaultMarshaler{}
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	switch {
	case config.URL == "":
		return nil, errors.New("amqpsource: URL is required")
	case config.Prefetch < 0:
		return nil, fmt.Errorf("amqpsource: Prefetch (%d) must not be negative", config.Prefetch)
	}
	conn, err := amqp.Dial(config.URL)
	if err != nil {
		return nil, fmt.Errorf("amqpsource: connecting: %w", err)
	}
	return &Subscriber{config: config, conn: conn, closing: make(chan struct{})}, nil
}

// Subscribe declares the durable queue named topic and consumes it on a
// channel of its own. The returned channel closes when ctx ends, the
// subscriber is closed, or the channel or connection closes (RabbitMQ then
// requeues what was not acked); subscribe again to go on.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	select {
	case <-s.closing:
		return nil, errors.New("amqpsource: subscriber closed")
	default:
	}
	ch, err := s.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqpsource: opening a channel: %w", err)
	}
	deliveries, err := s.consume(ch, topic)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	out := make(chan *message.Message)
	s.wg.Go(func() {
		defer close(out)
		defer ch.Close()
		sub := subscription{s: s, ctx: ctx, out: out, fields: watermill.LogFields{"topic": topic}}
		sub.run(deliveries)
	})
	return out, nil
}

// consume sets the channel's prefetch, declares the queue and starts
// consuming it.
func (s *Subscriber) consume(ch *amqp.Channel, queue string) (<-chan amqp.Delivery, error) {
	if err := ch.Qos(s.config.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("amqpsource: setting the prefetch of %s: %w", queue, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, s.config.QueueArguments); err != nil {
		return nil, fmt.Errorf("amqpsource: declaring queue %s: %w", queue, err)
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("amqpsource: consuming %s: %w", queue, err)
	}
	return deliveries, nil
}

// Close closes every subscription and the connection; RabbitMQ requeues
// the deliveries that were not acked.
func (s *Subscriber) Close() error {
	var err error
	s.once.Do(func() {
		close(s.closing)
		err = s.conn.Close()
		s.wg.Wait()
	})
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// subscription hands one channel's deliveries to its consumer.
type subscription struct {
	s      *Subscriber
	ctx    context.Context
	out    chan *message.Message
	fields watermill.LogFields
	acks   sync.WaitGroup
}

// run hands every delivery over without waiting for its ack, until the
// deliveries end, ctx ends or the subscriber closes; it returns once every
// message handed over is settled or can no longer be.
func (sub *subscription) run(deliveries <-chan amqp.Delivery) {
	defer sub.acks.Wait()
	for {
		select {
		case <-sub.ctx.Done():
			return
		case <-sub.s.closing:
			return
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			if !sub.handOver(d) {
				return
			}
		}
	}
}

// handOver sends d's message to the consumer and settles d once the
// message is; false when the consumer is gone. A delivery left unsettled
// is requeued by RabbitMQ when its channel closes.
func (sub *subscription) handOver(d amqp.Delivery) bool {
	msg, err := sub.s.config.Marshaler.Unmarshal(d)
	if err != nil {
		// Requeued, it would come back at once, forever: RabbitMQ drops it,
		// or dead-letters it when the queue has a dead-letter exchange.
		sub.s.config.Logger.Error("amqpsource: unreadable delivery rejected", err, sub.fields.Add(watermill.LogFields{"delivery_tag": d.DeliveryTag}))
		sub.settle(d.Reject(false))
		return true
	}
	if d.Redelivered {
		msg.Metadata.Set(wamqp.MetadataRedeliveredKey, "true")
	}
	d2 := handover.Delivery{Ack: func() error { return d.Ack(false) }, Nack: func() error { return d.Nack(false, true) }}
	return handover.Deliver(sub.ctx, sub.s.closing, sub.out, msg, d2, &sub.acks, sub.settle)
}

// settle logs an ack, nack or reject that failed: the delivery's channel
// has closed, and RabbitMQ requeues it.
func (sub *subscription) settle(err error) {
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		sub.s.config.Logger.Error("amqpsource: settling a delivery", err, sub.fields)
	}
}

var _ inbox.ManyUnacked = (*Subscriber)(nil)
