package brokers_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/observe"
)

// amqpConfig is watermill-amqp's durable queue (the queue is named after the
// topic) with prefetch unacknowledged deliveries per consumer.
func amqpConfig(uri string, prefetch int) amqp.Config {
	c := amqp.NewDurableQueueConfig(uri)
	c.Consume.Qos.PrefetchCount = prefetch
	c.Connection.Reconnect = &amqp.ReconnectConfig{BackoffInitialInterval: 20 * time.Millisecond, BackoffMultiplier: 1.5, BackoffMaxInterval: 200 * time.Millisecond}
	return c
}

// amqpQueue declares a durable queue with a unique name, as a subscriber
// would (RabbitMQ drops what is published to the default exchange for a
// queue that does not exist yet), and deletes it at the end.
func amqpQueue(t *testing.T) string {
	t.Helper()
	name := testdb.Name("orders")
	amqpChannel(t, func(ch *amqp091.Channel) {
		_, err := ch.QueueDeclare(name, true, false, false, false, nil)
		require.NoError(t, err)
	})
	t.Cleanup(func() {
		amqpChannel(t, func(ch *amqp091.Channel) {
			_, err := ch.QueueDelete(name, false, false, false)
			require.NoError(t, err)
		})
	})
	return name
}

// amqpChannel runs f on a channel of a connection of its own.
func amqpChannel(t *testing.T, f func(ch *amqp091.Channel)) {
	t.Helper()
	conn, err := amqp091.Dial(amqpURL())
	require.NoError(t, err, "no RabbitMQ answers at %s (run ./test.sh, which starts one)", amqpURL())
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	f(ch)
}

// amqpReady is the number of messages ready in queue (not delivered, or
// requeued).
func amqpReady(t *testing.T, queue string) int {
	t.Helper()
	var n int
	amqpChannel(t, func(ch *amqp091.Channel) {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		require.NoError(t, err)
		n = q.Messages
	})
	return n
}

func amqpPublisher(t *testing.T, config amqp.Config) *amqp.Publisher {
	t.Helper()
	pub, err := amqp.NewPublisher(config, logger)
	require.NoError(t, err, "no RabbitMQ answers at %s (run ./test.sh, which starts one)", amqpURL())
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func amqpSubscriber(t *testing.T, config amqp.Config) *amqp.Subscriber {
	t.Helper()
	sub, err := amqp.NewSubscriber(config, logger)
	require.NoError(t, err, "no RabbitMQ answers at %s (run ./test.sh, which starts one)", amqpURL())
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// amqpRedelivered is RabbitMQ's own mark of a redelivery, which
// watermill-amqp copies into the metadata.
func amqpRedelivered(msg *message.Message) bool {
	return msg.Metadata.Get(amqp.MetadataRedeliveredKey) == "true"
}

// A handler error nacks the message and RabbitMQ requeues it (the default:
// NoRequeueOnNack false). The consumer here fails every third message after
// its commit, as one that dies before its ack; the requeued copy is a
// duplicate.
func TestAMQPNackRequeues(t *testing.T) {
	t.Parallel()
	start := time.Now()
	db := testdb.Postgres(t, "pgx")
	queue := amqpQueue(t)
	config := amqpConfig(amqpURL(), 10)
	ids := effects.PublishEvents(t, amqpPublisher(t, config), queue, 30)

	billing := effects.NewService(t, db, "billing")
	nack, nacks := effects.NackAfterCommit(3)
	causes := newDeliveries(map[string]func(*message.Message) bool{"requeued after nack": amqpRedelivered})
	billing.Run(t, amqpSubscriber(t, config), queue, effects.RunConfig{Outer: causes.middleware(nack)})
	require.Eventually(t, func() bool {
		return billing.Handled.Load() == 30 && billing.Outcomes()[observe.Duplicate] == nacks.Load()
	}, effects.WaitFor, 20*time.Millisecond)

	billing.RequireExactlyOnce(t, ids)
	require.EqualValues(t, 10, nacks.Load())
	require.EqualValues(t, nacks.Load(), causes.count("requeued after nack"), "every nacked message came back once, marked redelivered")
	require.EqualValues(t, 40, billing.Delivered.Load())
	require.Zero(t, amqpReady(t, queue))
	report(t, start, ids, causes, billing)
}

// A consumer process with ten unacknowledged deliveries in flight (prefetch
// 10) is SIGKILLed right after its 15th commit. RabbitMQ requeues every
// unacknowledged delivery when the connection drops: the one whose effect
// committed is a duplicate, the others are new.
func TestAMQPConsumerKilledWithUnackedDeliveries(t *testing.T) {
	if killtest.ConsumeUntilKilled(t, func(c killtest.Consumer) message.Subscriber {
		return amqpSubscriber(t, amqpConfig(c.Server, 10))
	}) {
		return
	}
	t.Parallel()
	start := time.Now()
	db := testdb.Postgres(t, "pgx")
	queue := amqpQueue(t)
	config := amqpConfig(amqpURL(), 10)
	ids := effects.PublishEvents(t, amqpPublisher(t, config), queue, 40)
	billing := effects.NewService(t, db, "billing")

	committed := killtest.KillConsumer(t, billing, amqpURL(), queue, 15)
	require.Equal(t, 15, committed, "one message at a time")
	// RabbitMQ notices the dead connection and requeues what it had not
	// been acked for: the committed 15th and the prefetched ones.
	var ready int
	require.Eventually(t, func() bool { ready = amqpReady(t, queue); return ready > len(ids)-committed }, effects.WaitFor, 20*time.Millisecond)

	causes := newDeliveries(map[string]func(*message.Message) bool{"requeued from the killed consumer": amqpRedelivered})
	billing.Run(t, amqpSubscriber(t, config), queue, effects.RunConfig{Outer: causes.middleware(nil)})
	require.Eventually(t, func() bool { return billing.Delivered.Load() == int64(ready) }, effects.WaitFor, 20*time.Millisecond)
	require.Eventually(t, func() bool { return amqpReady(t, queue) == 0 }, effects.WaitFor, 20*time.Millisecond)
	billing.RequireExactlyOnce(t, ids)

	require.EqualValues(t, len(ids)-committed, billing.Handled.Load(), "the restarted consumer handled only the rest")
	billing.Settled(t)
	duplicates := billing.Outcomes()[observe.Duplicate]
	require.EqualValues(t, ready-(len(ids)-committed), duplicates, "every committed but unacknowledged event was skipped")
	require.GreaterOrEqual(t, duplicates, int64(1))
	require.Greater(t, causes.count("requeued from the killed consumer"), int(duplicates), "prefetched deliveries were requeued too")
	t.Logf("child committed %d effects; %d messages were back in the queue", committed, ready)
	report(t, start, ids, causes, billing)
}

// The publisher's connection drops after RabbitMQ stored a message and
// before its publisher confirm arrived (ConfirmDelivery): Publish fails, and
// the producer (a relay) publishes the same message again. The queue then
// holds two copies with one id.
func TestAMQPPublisherRetriesAfterLostConfirm(t *testing.T) {
	t.Parallel()
	start := time.Now()
	db := testdb.Postgres(t, "pgx")
	queue := amqpQueue(t)

	// The relay publishes through a TCP proxy, so that the test can hold
	// what RabbitMQ sends back and cut the connection.
	u, err := url.Parse(amqpURL())
	require.NoError(t, err)
	proxies := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	var (
		proxy *toxiproxy.Proxy
		pub   *amqp.Publisher
	)
	// connect starts a relay: a new proxy (on a port of its own: another
	// connection may take a released one) and a publisher through it. After
	// a failed publish the relay starts over, as a restarted relay would
	// (and because publishing while watermill-amqp v3.0.2 reconnects is a
	// data race in its ConnectionWrapper).
	connect := func() {
		if pub != nil {
			_ = pub.Close()
		}
		proxy = toxiproxy.NewProxy(proxies, testdb.Name("amqp"), "127.0.0.1:0", u.Host)
		require.NoError(t, proxy.Start())
		t.Cleanup(proxy.Stop)
		proxied := *u
		proxied.Host = proxy.Listen
		config := amqpConfig(proxied.String(), 10)
		config.Publish.ConfirmDelivery = true
		// A channel opened up front: a channel opened per publish would wait
		// for its open-ok behind the held confirms.
		config.Publish.ChannelPoolSize = 1
		pub = amqpPublisher(t, config)
	}
	connect()

	const n, loseEvery = 20, 5
	var ids []string
	lost := 0
	for i := range n {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		ids = append(ids, msg.UUID)
		if i%loseEvery != loseEvery-1 {
			require.NoError(t, pub.Publish(queue, msg))
			continue
		}
		// Hold everything RabbitMQ sends to the publisher, confirms
		// included, until the message is in the queue; then cut the
		// connection.
		before := amqpReady(t, queue)
		_, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"hold","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`))
		require.NoError(t, err)
		failed := make(chan error, 1)
		go func() { failed <- pub.Publish(queue, msg) }()
		require.Eventually(t, func() bool { return amqpReady(t, queue) == before+1 }, effects.WaitFor, 10*time.Millisecond)
		proxy.Stop()
		err = <-failed
		require.Error(t, err, "the publish whose confirm was lost must fail")
		lost++
		connect()
		require.NoError(t, pub.Publish(queue, msg))
	}
	require.Equal(t, n+lost, amqpReady(t, queue), "the queue holds every event plus the republished ones")

	billing := effects.NewService(t, db, "billing")
	billing.Run(t, amqpSubscriber(t, amqpConfig(amqpURL(), 10)), queue, effects.RunConfig{})
	require.Eventually(t, func() bool { return billing.Delivered.Load() == int64(n+lost) }, effects.WaitFor, 20*time.Millisecond)
	require.Eventually(t, func() bool { return amqpReady(t, queue) == 0 && billing.Handled.Load() == n }, effects.WaitFor, 20*time.Millisecond)
	billing.RequireExactlyOnce(t, ids)
	billing.Settled(t)
	require.EqualValues(t, lost, billing.Outcomes()[observe.Duplicate])
	report(t, start, ids, counted{"republished after a lost confirm": lost}, billing)
}
