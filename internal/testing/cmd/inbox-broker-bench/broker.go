package main

import (
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/watermill-inbox/inbox/sources/amqpsource"
	"github.com/watermill-inbox/inbox/sources/natssource"
)

// broker is where a run's events wait: a topic made and filled before the
// consumers start, and the subscribers of each mode.
type broker struct {
	name string
	// publish makes topic and publishes n events to it with the broker's
	// Watermill publisher; the function it returns removes topic.
	publish func(o options, topic string) (remove func(), err error)
	// perMessage is the per-message inbox's subscriber.
	perMessage func(o options, topic string) (message.Subscriber, error)
	// batch is the batch source, for the batch and bare modes.
	batch func(o options, topic string) (message.Subscriber, error)
}

var brokers = map[string]broker{
	"rabbitmq": {
		name: "RabbitMQ",
		publish: func(o options, queue string) (func(), error) {
			conn, err := amqp.Dial(o.amqpURL)
			if err != nil {
				return nil, err
			}
			ch, err := conn.Channel()
			if err == nil {
				_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
			}
			remove := func() {
				_, _ = ch.QueueDelete(queue, false, false, false)
				_ = conn.Close()
			}
			if err != nil {
				remove()
				return nil, err
			}
			pub, err := wamqp.NewPublisher(wamqp.NewDurableQueueConfig(o.amqpURL), watermill.NopLogger{})
			if err != nil {
				remove()
				return nil, err
			}
			defer pub.Close()
			return remove, publishEvents(pub, queue, o.events)
		},
		// watermill-amqp, one handler per replica: a delivery at a time.
		perMessage: func(o options, _ string) (message.Subscriber, error) {
			return wamqp.NewSubscriber(wamqp.NewDurableQueueConfig(o.amqpURL), watermill.NopLogger{})
		},
		batch: func(o options, _ string) (message.Subscriber, error) {
			return amqpsource.NewSubscriber(amqpsource.Config{URL: o.amqpURL, Prefetch: 2 * o.size})
		},
	},
	"nats": {
		name: "NATS JetStream",
		publish: func(o options, subject string) (func(), error) {
			nc, err := nats.Connect(o.natsURL)
			if err != nil {
				return nil, err
			}
			js, err := nc.JetStream()
			if err == nil {
				_, err = js.AddStream(&nats.StreamConfig{Name: subject, Subjects: []string{subject}})
			}
			remove := func() {
				_ = js.DeleteStream(subject)
				nc.Close()
			}
			if err != nil {
				remove()
				return nil, err
			}
			pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{URL: o.natsURL}, watermill.NopLogger{})
			if err != nil {
				remove()
				return nil, err
			}
			defer pub.Close()
			return remove, publishEvents(pub, subject, o.events)
		},
		// natssource with one message unacked per replica: what
		// watermill-nats hands a handler, without its subscriber's panic
		// at Close (v2.1.3).
		perMessage: func(o options, subject string) (message.Subscriber, error) {
			return natssource.NewSubscriber(natssource.Config{URL: o.natsURL, Durable: subject, MaxAckPending: o.replicas})
		},
		batch: func(o options, subject string) (message.Subscriber, error) {
			return natssource.NewSubscriber(natssource.Config{URL: o.natsURL, Durable: subject, MaxAckPending: 2 * o.size * o.replicas})
		},
	},
}

func brokerNamed(name string) (broker, error) {
	b, ok := brokers[strings.ToLower(name)]
	if !ok {
		return broker{}, fmt.Errorf("-broker %q: rabbitmq or nats", name)
	}
	return b, nil
}

func publishEvents(pub message.Publisher, topic string, n int) error {
	for range n {
		if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)); err != nil {
			return err
		}
	}
	return nil
}
