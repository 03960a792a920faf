package brokers_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/conformancetest"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/observe"
)

// The scale of the workers tests: workersPerReplica subscriptions of one
// queue in each of two replicas (routers), workerEvents events each
// published workerCopies times.
const (
	workersPerReplica = 8
	workerReplicas    = 2
	workerEvents      = 1000
	workerCopies      = 3
)

// workerBroker is a broker whose subscriptions of one queue compete for its
// messages, each holding one unacked message at a time.
type workerBroker struct {
	name string
	// queue returns a new queue (topic), its publisher, a new subscriber
	// of it (one per replica), and, where the broker drops what is acked,
	// the number of its messages not acked once the subscribers closed.
	queue func(t *testing.T) (topic string, pub message.Publisher, sub func() message.Subscriber, left func() int)
	// fanOut returns a new topic, its publisher, and a new subscriber
	// of a queue of its own per consumer, each getting every message.
	fanOut func(t *testing.T) (topic string, pub message.Publisher, sub func(consumer string) message.Subscriber)
}

var workerBrokers = []workerBroker{
	{
		name: "RabbitMQ",
		queue: func(t *testing.T) (string, message.Publisher, func() message.Subscriber, func() int) {
			queue := amqpQueue(t)
			config := amqpConfig(amqpURL(), 1)
			return queue, amqpPublisher(t, config),
				func() message.Subscriber { return amqpSubscriber(t, config) },
				func() int { return amqpReady(t, queue) }
		},
		fanOut: func(t *testing.T) (string, message.Publisher, func(string) message.Subscriber) {
			topic := testdb.Name("orders")
			t.Cleanup(func() {
				amqpChannel(t, func(ch *amqp091.Channel) {
					for _, c := range []string{"invoicing", "analytics"} {
						_, _ = ch.QueueDelete(topic+"_"+c, false, false, false)
					}
					_ = ch.ExchangeDelete(topic, false, false)
				})
			})
			config := func(consumer string) amqp.Config {
				c := amqp.NewDurablePubSubConfig(amqpURL(), amqp.GenerateQueueNameTopicNameWithSuffix(consumer))
				c.Consume.Qos.PrefetchCount = 1
				return c
			}
			return topic, amqpPublisher(t, config("")),
				func(consumer string) message.Subscriber { return amqpSubscriber(t, config(consumer)) }
		},
	},
	{
		name: "NATS JetStream",
		queue: func(t *testing.T) (string, message.Publisher, func() message.Subscriber, func() int) {
			// The stream keeps every message, acked or not.
			stream := natsStream(t, natsURL(), 1)
			return stream, natsPublisher(t, natsURL()),
				func() message.Subscriber { return natsSubscriber(t, natsURL(), effects.WaitFor, 1) }, nil
		},
		fanOut: func(t *testing.T) (string, message.Publisher, func(string) message.Subscriber) {
			stream := natsStream(t, natsURL(), 1)
			return stream, natsPublisher(t, natsURL()), func(consumer string) message.Subscriber {
				c := natsSubscriberConfig(natsURL(), effects.WaitFor, 1)
				c.QueueGroupPrefix, c.JetStream.DurablePrefix = consumer, consumer
				sub, err := wmnats.NewSubscriber(c, logger)
				require.NoError(t, err)
				t.Cleanup(func() { _ = sub.Close() })
				return sub
			}
		},
	},
}

// workerWiring is one way to run a handler on several subscriptions of one
// queue in each replica.
type workerWiring struct {
	name string
	// names are the router handler names of the handler in a replica.
	names []string
	// subscriptions adds the handler once, as documented, instead.
	subscriptions bool
	config        inbox.Config
}

func workerWirings() []workerWiring {
	names := make([]string, workersPerReplica)
	for i := range names {
		names[i] = fmt.Sprintf("orders-%d", i+1)
	}
	return []workerWiring{
		{name: "inbox.Subscriptions", subscriptions: true},
		{name: "one name each, default consumer", names: names},
		{name: "one name each, one fixed Consumer", names: names, config: inbox.Config{Consumer: "orders"}},
		{name: "one name each, fixed Consumer and ShareConsumer", names: names, config: inbox.Config{Consumer: "orders", ShareConsumer: true}},
	}
}

// The ways a user scales one handler on one queue (8 subscriptions in each
// of 2 replicas, 1,000 events delivered 3 times each): the documented one,
// inbox.Subscriptions, and the three a user wires by hand with the handler
// under 8 names. Each event's effect happens once and no copy is poisoned;
// the wiring whose consumers cannot be joined safely (each name its own, by
// default) is refused, the messages kept in the broker, with one error log
// per replica naming the fix. Events are published in three rounds, so
// that the copies of an event reach the workers apart, as a relay's and a
// redelivery's do.
func TestWorkersOnOneQueue(t *testing.T) {
	for _, b := range workerBrokers {
		t.Run(b.name, func(t *testing.T) {
			for _, w := range workerWirings() {
				t.Run(w.name, func(t *testing.T) {
					start := time.Now()
					db := testdb.Postgres(t, "pgx")
					topic, pub, subscriber, left := b.queue(t)
					s := effects.NewService(t, db, "orders")
					var poisoned atomic.Int64
					loggers := make([]*conformancetest.Logger, workerReplicas)
					stops := make([]func(), workerReplicas)
					for r := range loggers {
						loggers[r] = conformancetest.NewLogger()
						config := w.config
						config.Store, config.Observer, config.Logger = s.Store, s, loggers[r]
						add := workerHandlers(w.names, s.Handler(effects.RunConfig{}))
						if w.subscriptions {
							add = documentedWorkers(s.Handler(effects.RunConfig{}))
						}
						stops[r] = runWorkers(t, subscriber(), topic, config, &poisoned, add)
					}
					ids := publishCopies(t, pub, topic, workerEvents, workerCopies)

					refused := func() int {
						n := 0
						for _, l := range loggers {
							for _, e := range l.Errors() {
								if strings.HasPrefix(e.Msg, "Inbox: message refused, kept in the broker") {
									n++
								}
							}
						}
						return n
					}
					ended := func() int64 {
						o := s.Outcomes()
						return o[observe.Processed] + o[observe.Duplicate] + poisoned.Load()
					}
					require.Eventually(t, func() bool {
						return ended() >= workerEvents*workerCopies || refused() == workerReplicas
					}, effects.WaitFor, 20*time.Millisecond, "outcomes %v, poisoned %d", s.Outcomes(), poisoned.Load())
					for _, stop := range stops {
						stop()
					}
					o := s.Outcomes()
					t.Logf("report %s: effects %d for %d events, outcomes %v, poisoned %d, %s",
						t.Name(), s.EffectRows(t), workerEvents, o, poisoned.Load(), time.Since(start).Round(time.Millisecond))
					for id, n := range s.EffectCounts(t) {
						require.Equal(t, 1, n, "effects of event %s", id)
					}
					require.Zero(t, poisoned.Load(), "copies poisoned")
					if w.config.Consumer == "" && !w.subscriptions {
						require.Equal(t, workerReplicas, refused(), "one error log per replica")
						require.Positive(t, o[observe.Miswired])
						if left == nil {
							return
						}
						acked := o[observe.Processed] + o[observe.Duplicate]
						require.Eventually(t, func() bool { return left() == workerEvents*workerCopies-int(acked) },
							effects.WaitFor, 20*time.Millisecond, "the refused messages are kept in the broker")
						return
					}
					s.RequireExactlyOnce(t, ids)
					require.Zero(t, refused())
					require.EqualValues(t, workerEvents*(workerCopies-1), o[observe.Duplicate], "every other copy acked as a duplicate")
					require.Zero(t, o[observe.Miswired])
				})
			}
		})
	}
}

// A fan-out: two handlers, each with its own function, queue and (default)
// consumer, behind one middleware on one topic. Each runs every event once.
func TestWorkersFanOut(t *testing.T) {
	for _, b := range workerBrokers {
		t.Run(b.name, func(t *testing.T) {
			start := time.Now()
			db := testdb.Postgres(t, "pgx")
			topic, pub, subscriber := b.fanOut(t)
			invoicing := effects.NewService(t, db, "invoicing")
			analytics := effects.NewService(t, db, "analytics")
			var poisoned atomic.Int64
			// Two functions: the same function under two names on one topic
			// would be taken for workers of one queue.
			invoice, count := invoicing.Handler(effects.RunConfig{}), analytics.Handler(effects.RunConfig{})
			config := inbox.Config{Store: invoicing.Store, Observer: invoicing, Logger: conformancetest.NewLogger()}
			stop := runWorkers(t, nil, topic, config, &poisoned, func(r *message.Router, mw message.HandlerMiddleware, _ message.Subscriber, topic string) {
				r.AddMiddleware(mw)
				r.AddHandler("invoicing", topic, subscriber("invoicing"), "", effects.DiscardPublisher{}, func(msg *message.Message) ([]*message.Message, error) { return invoice(msg) })
				r.AddHandler("analytics", topic, subscriber("analytics"), "", effects.DiscardPublisher{}, func(msg *message.Message) ([]*message.Message, error) { return count(msg) })
			})
			ids := publishCopies(t, pub, topic, workerEvents, workerCopies)
			require.Eventually(t, func() bool {
				o := invoicing.Outcomes()
				return o[observe.Processed]+o[observe.Duplicate]+poisoned.Load() >= 2*workerEvents*workerCopies
			}, effects.WaitFor, 20*time.Millisecond, "outcomes %v", invoicing.Outcomes())
			stop()
			t.Logf("report %s: effects %d and %d for %d events, outcomes %v, %s", t.Name(),
				invoicing.EffectRows(t), analytics.EffectRows(t), workerEvents, invoicing.Outcomes(), time.Since(start).Round(time.Millisecond))
			invoicing.RequireExactlyOnce(t, ids)
			analytics.RequireExactlyOnce(t, ids)
			require.Zero(t, poisoned.Load())
		})
	}
}

// workerHandlers adds h under each of names, on sub, behind the router-level
// inbox mw, added last.
func workerHandlers(names []string, h message.HandlerFunc) func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, topic string) {
	return func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, topic string) {
		r.AddMiddleware(mw)
		for _, name := range names {
			r.AddHandler(name, topic, sub, "", effects.DiscardPublisher{}, h)
		}
	}
}

// documentedWorkers adds h once, on 8 subscriptions, as README.md shows.
func documentedWorkers(h message.HandlerFunc) func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, topic string) {
	handle := func(msg *message.Message) error { _, err := h(msg); return err }
	return func(router *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, topic string) {
		router.AddConsumerHandler("invoicing", topic, inbox.Subscriptions(sub, 8), inbox.ConsumerHandler(mw, handle))
	}
}

// runWorkers runs a router with the README's PoisonQueue, taking what
// inbox.IsTransient does not report (counted in poisoned), and the handlers
// add adds with the inbox of config.
func runWorkers(t *testing.T, sub message.Subscriber, topic string, config inbox.Config, poisoned *atomic.Int64, add func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, topic string)) (stop func()) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	poison, err := middleware.PoisonQueueWithFilter(poisonCounter{poisoned}, "poison", func(err error) bool { return !inbox.IsTransient(err) })
	require.NoError(t, err)
	mw, err := inbox.NewMiddleware(config)
	require.NoError(t, err)
	router.AddMiddleware(poison)
	add(router, mw, sub, topic)
	return effects.StartRouter(t, router)
}

// poisonCounter counts what is published to it, publishing nothing.
type poisonCounter struct{ n *atomic.Int64 }

func (p poisonCounter) Publish(_ string, msgs ...*message.Message) error {
	p.n.Add(int64(len(msgs)))
	return nil
}

func (poisonCounter) Close() error { return nil }

// publishCopies publishes n new events to topic copies times, in rounds, and
// returns their ids.
func publishCopies(t *testing.T, pub message.Publisher, topic string, n, copies int) []string {
	t.Helper()
	ids := effects.PublishEvents(t, pub, topic, n)
	for range copies - 1 {
		for i, id := range ids {
			require.NoError(t, pub.Publish(topic, message.NewMessage(id, fmt.Appendf(nil, `{"n":%d}`, i))))
		}
	}
	return ids
}
