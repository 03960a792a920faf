package brokers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmjetstream "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/jetstream"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// hop is one broker and marshaler: a topic, and a publisher and subscriber
// that use the marshaler.
type hop struct {
	name  string
	setup func(t *testing.T) (topic string, pub message.Publisher, sub message.Subscriber)
}

func amqpHop(name string, marshaler amqp.Marshaler) hop {
	return hop{name, func(t *testing.T) (string, message.Publisher, message.Subscriber) {
		config := amqpConfig(amqpURL(), 10)
		config.Marshaler = marshaler
		return amqpQueue(t), amqpPublisher(t, config), amqpSubscriber(t, config)
	}}
}

func natsHop(name string, marshaler wmnats.MarshalerUnmarshaler) hop {
	return hop{name, func(t *testing.T) (string, message.Publisher, message.Subscriber) {
		pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{URL: natsURL(), Marshaler: marshaler, JetStream: natsJetStream(0)}, logger)
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		config := natsSubscriberConfig(natsURL(), 30*time.Second, 1)
		config.Unmarshaler = marshaler
		sub, err := newCloseSafeSubscriber(config)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return natsStream(t, natsURL(), 1), pub, sub
	}}
}

// hops is every marshaler of the three brokers.
var hops = []hop{
	amqpHop("amqp DefaultMarshaler", amqp.DefaultMarshaler{}),
	amqpHop("amqp CorrelatingMarshaler", amqp.CorrelatingMarshaler{}),
	natsHop("nats NATSMarshaler", &wmnats.NATSMarshaler{}),
	natsHop("nats GobMarshaler", &wmnats.GobMarshaler{}),
	natsHop("nats JSONMarshaler", &wmnats.JSONMarshaler{}),
	{"nats jetstream package", func(t *testing.T) (string, message.Publisher, message.Subscriber) {
		pub, err := wmjetstream.NewPublisher(wmjetstream.PublisherConfig{URL: natsURL(), Logger: logger})
		require.NoError(t, err)
		t.Cleanup(func() { _ = pub.Close() })
		sub, err := wmjetstream.NewSubscriber(wmjetstream.SubscriberConfig{URL: natsURL(), Logger: logger})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Close() })
		return natsStream(t, natsURL(), 1), pub, sub
	}},
	{"redisstream DefaultMarshallerUnmarshaller", func(t *testing.T) (string, message.Publisher, message.Subscriber) {
		return redisStream(t), redisPublisher(t), redisSubscriber(t, redisAddr(), "billing")
	}},
}

// Does the event id survive the hop? Two copies of one message (a
// redelivery, a relay that publishes twice) must reach the inbox with the
// same default id, msg.UUID; two messages with different UUIDs and one
// "event_id" metadata value (a relay that builds a new envelope) must too.
// A marshaler that dropped either would make every copy look new.
func TestEventIDSurvivesTheHop(t *testing.T) {
	t.Parallel()
	for _, h := range hops {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Postgres(t, "pgx")
			topic, pub, sub := h.setup(t)

			same := message.NewMessage(watermill.NewUUID(), []byte(`{"copy":"same message"}`))
			eventID := watermill.NewUUID()
			enveloped := func() *message.Message {
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{"copy":"new envelope"}`))
				msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, eventID)
				return msg
			}
			require.NoError(t, pub.Publish(topic, same))
			require.NoError(t, pub.Publish(topic, same))
			require.NoError(t, pub.Publish(topic, enveloped()))
			require.NoError(t, pub.Publish(topic, enveloped()))

			billing := effects.NewService(t, db, "billing")
			billing.Run(t, sub, topic, effects.RunConfig{})
			require.Eventually(t, func() bool { return billing.Delivered.Load() == 4 }, effects.WaitFor, 20*time.Millisecond)
			require.Eventually(t, func() bool { return billing.Outcomes()[observe.Duplicate] == 2 }, effects.WaitFor, 20*time.Millisecond,
				"outcomes %v", billing.Outcomes())
			billing.RequireExactlyOnce(t, []string{same.UUID, eventID})
		})
	}
}

// Where the id does not survive: watermill-amqp's CorrelatingMarshaler
// carries msg.UUID in the AMQP correlation id, and the example in its own
// doc comment has PostprocessPublishing overwrite that field with a constant.
// Every message then arrives with one UUID: without fingerprints the inbox
// takes the second and third events for duplicates of the first and acks
// them silently; with inbox.Config.Fingerprint it reports each as a reused
// id (OutcomeIDReused, an error line in the log).
func TestEventIDOverwrittenByCorrelationID(t *testing.T) {
	t.Parallel()
	for _, fingerprint := range []bool{false, true} {
		name := map[bool]string{false: "silent without fingerprints", true: "loud with fingerprints"}[fingerprint]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Postgres(t, "pgx")
			config := amqpConfig(amqpURL(), 10)
			config.Marshaler = amqp.CorrelatingMarshaler{PostprocessPublishing: func(p amqp091.Publishing) amqp091.Publishing {
				p.CorrelationId = "correlation"
				return p
			}}
			queue := amqpQueue(t)
			pub := amqpPublisher(t, config)
			for i := range 3 {
				require.NoError(t, pub.Publish(queue, message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%d}`, i))))
			}

			billing := effects.NewServiceWith(t, db, "billing", sqlinbox.Config{Fingerprints: fingerprint})
			logs := watermill.NewCaptureLogger()
			billing.Run(t, amqpSubscriber(t, config), queue, effects.RunConfig{Inbox: func(c *inbox.Config) {
				c.Logger = logs
				if fingerprint {
					c.Fingerprint = inbox.PayloadFingerprint
				}
			}})
			require.Eventually(t, func() bool { return billing.Delivered.Load() == 3 && amqpReady(t, queue) == 0 }, effects.WaitFor, 20*time.Millisecond)
			require.Eventually(t, func() bool {
				o := billing.Outcomes()
				return o[observe.Duplicate]+o[observe.IDReused] == 2
			}, effects.WaitFor, 20*time.Millisecond)
			// Three events, one effect: the hazard itself.
			require.Equal(t, map[string]int{"correlation": 1}, billing.EffectCounts(t))
			o := billing.Outcomes()
			if !fingerprint {
				require.EqualValues(t, 2, o[observe.Duplicate])
				require.Empty(t, logs.Captured()[watermill.ErrorLogLevel])
				return
			}
			require.EqualValues(t, 2, o[observe.IDReused])
			require.Len(t, logs.Captured()[watermill.ErrorLogLevel], 2, "each reused id is logged at error level")
		})
	}
}

// A message from a client that is not Watermill has no UUID header: it
// unmarshals with an empty UUID, and the inbox refuses it with
// inbox.ErrMissingEventID before any SQL; the handler never runs.
func TestEventIDMissingFromForeignPublisher(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		publish func(t *testing.T) (topic string, sub message.Subscriber)
	}{
		{"amqp", func(t *testing.T) (string, message.Subscriber) {
			queue := amqpQueue(t)
			amqpChannel(t, func(ch *amqp091.Channel) {
				require.NoError(t, ch.PublishWithContext(t.Context(), "", queue, false, false, amqp091.Publishing{Body: []byte(`{}`)}))
			})
			config := amqpConfig(amqpURL(), 10)
			config.Consume.NoRequeueOnNack = true // or it comes back at once, forever
			return queue, amqpSubscriber(t, config)
		}},
		{"nats", func(t *testing.T) (string, message.Subscriber) {
			stream := natsStream(t, natsURL(), 1)
			js, err := natsConnect(t, natsURL()).JetStream()
			require.NoError(t, err)
			_, err = js.Publish(stream, []byte(`{}`))
			require.NoError(t, err)
			config := natsSubscriberConfig(natsURL(), 30*time.Second, 1)
			config.NakDelay = wmnats.NewStaticDelay(time.Minute) // not at once, forever
			sub, err := newCloseSafeSubscriber(config)
			require.NoError(t, err)
			t.Cleanup(func() { _ = sub.Close() })
			return stream, sub
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Postgres(t, "pgx")
			topic, sub := tc.publish(t)
			billing := effects.NewService(t, db, "billing")
			billing.Run(t, sub, topic, effects.RunConfig{})
			require.Eventually(t, func() bool { return billing.Outcomes()[observe.MissingID] >= 1 }, effects.WaitFor, 20*time.Millisecond)
			require.Zero(t, billing.Handled.Load())
			require.Zero(t, billing.EffectRows(t))
		})
	}
}
