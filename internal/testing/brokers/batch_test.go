package brokers_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// How large a batch can get, per broker: 300 events already waiting, read
// by inbox.BatchConsumer.Run with MaxSize 100. Watermill's AMQP, NATS and
// Redis Streams subscribers deliver a subscription's next message only
// after the previous one is acked, so with one subscription every batch
// holds one message; with 32 (BatchConfig.Subscriptions) a RabbitMQ or
// Redis Streams batch holds up to 32. A JetStream batch stays at one
// message with 32 subscriptions of the durable's queue group too. Every
// event is handled once.
func TestBatchSizePerBroker(t *testing.T) {
	t.Parallel()
	const events = 300
	type broker struct {
		name string
		// open publishes to topic and subscribes to it with subscriptions
		// subscriptions in all; runSubs is what BatchConfig.Subscriptions
		// must be for that.
		open func(t *testing.T, topic string, subscriptions int) (pub message.Publisher, sub message.Subscriber, runSubs int)
		// topic makes the topic, where the broker needs it made.
		topic func(t *testing.T) string
		// grows: more subscriptions make larger batches.
		grows bool
	}
	brokers := []broker{
		{"RabbitMQ", func(t *testing.T, _ string, subs int) (message.Publisher, message.Subscriber, int) {
			c := amqpConfig(amqpURL(), 1)
			return amqpPublisher(t, c), amqpSubscriber(t, c), subs
		}, amqpQueue, true},
		{"NATS-JetStream", func(t *testing.T, _ string, subs int) (message.Publisher, message.Subscriber, int) {
			return natsPublisher(t, natsURL()), natsSubscriber(t, natsURL(), time.Minute, 1), subs
		}, func(t *testing.T) string { return natsStream(t, natsURL(), 1) }, false},
		{"Redis-Streams", func(t *testing.T, _ string, subs int) (message.Publisher, message.Subscriber, int) {
			return redisPublisher(t), redisSubscriber(t, redisAddr(), "batch"), subs
		}, redisStream, true},
	}
	for _, b := range brokers {
		for _, subs := range []int{1, 32} {
			t.Run(fmt.Sprintf("%s/subscriptions=%d", b.name, subs), func(t *testing.T) {
				t.Parallel()
				topic := b.topic(t)
				pub, sub, runSubs := b.open(t, topic, subs)
				for i := range events {
					msg := message.NewMessage(watermill.NewUUID(), nil)
					msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("e-%d", i))
					require.NoError(t, pub.Publish(topic, msg))
				}
				sizes, _ := runBatches(t, sub, topic, inbox.BatchConfig{MaxSize: 100, MaxWait: 50 * time.Millisecond, Subscriptions: runSubs}, events)
				slices.Sort(sizes)
				t.Logf("%s, %d subscriptions: %d batches, size median %d, max %d", b.name, subs, len(sizes), sizes[len(sizes)/2], sizes[len(sizes)-1])
				require.LessOrEqual(t, sizes[len(sizes)-1], subs, "a batch holds at most one message per subscription")
				if subs > 1 && b.grows {
					require.Greater(t, sizes[len(sizes)-1], 1)
				}
			})
		}
	}
}

// sqliteStore is an inbox store on a SQLite file of the test's own.
func sqliteStore(t *testing.T) *sqlinbox.Store {
	db, err := sql.Open("sqlite", sqlinbox.SQLiteDSN(testdb.SQLiteFile(t)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	return store
}

// runBatches runs a batch consumer on topic until it handled events
// distinct events, and returns the size of every batch handed over and the
// time from the first batch to the last.
func runBatches(t *testing.T, sub message.Subscriber, topic string, config inbox.BatchConfig, events int) (sizes []int, busy time.Duration) {
	store := sqliteStore(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		mu    sync.Mutex
		seen  = map[string]int{}
		first time.Time
	)
	config.Store, config.Consumer = store, "batch"
	c, err := inbox.NewBatchConsumer(config,
		func(ctx context.Context, msgs []*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if first.IsZero() {
				first = time.Now()
			}
			sizes = append(sizes, len(msgs))
			for _, msg := range msgs {
				seen[msg.Metadata.Get(inbox.DefaultEventIDMetadataKey)]++
			}
			if len(seen) == events {
				busy = time.Since(first)
				stop()
			}
			inbox.TxNotNeeded(ctx)
			return nil
		})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sub, topic) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the events were not all handled")
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range seen {
		require.Equal(t, 1, n, id)
	}
	return slices.Clone(sizes), busy
}

// The example of docs/batch.md (MaxSize 100, every other field its
// default) on RabbitMQ handles 300 waiting events (first handler call to last) at least about as fast
// as the per-message inbox does: its default Subscriptions lets a batch
// fill instead of waiting MaxWait for messages one subscription cannot
// deliver (19 msgs/s with one subscription).
func TestBatchDocsExampleOnRabbitMQ(t *testing.T) {
	t.Parallel()
	const events = 300
	c := amqpConfig(amqpURL(), 0)
	publish := func(topic string) {
		pub := amqpPublisher(t, c)
		for i := range events {
			msg := message.NewMessage(watermill.NewUUID(), nil)
			msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, fmt.Sprintf("e-%d", i))
			require.NoError(t, pub.Publish(topic, msg))
		}
	}

	topic := amqpQueue(t)
	publish(topic)
	sizes, batched := runBatches(t, amqpSubscriber(t, c), topic, inbox.BatchConfig{MaxSize: 100}, events)

	topic = amqpQueue(t)
	publish(topic)
	store := sqliteStore(t)
	var (
		mu    sync.Mutex
		seen  = map[string]bool{}
		all   = make(chan struct{})
		start time.Time
	)
	stop := runWorkers(t, amqpSubscriber(t, c), topic, inbox.Config{Store: store}, new(atomic.Int64), func(r *message.Router, mw message.HandlerMiddleware, sub message.Subscriber, topic string) {
		r.AddConsumerHandler("invoicing", topic, sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
			inbox.TxNotNeeded(msg.Context())
			mu.Lock()
			defer mu.Unlock()
			if start.IsZero() {
				start = time.Now()
			}
			seen[msg.Metadata.Get(inbox.DefaultEventIDMetadataKey)] = true
			if len(seen) == events {
				close(all)
			}
			return nil
		}))
	})
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		t.Fatal("the per-message inbox did not handle every event")
	}
	mu.Lock()
	single := time.Since(start)
	mu.Unlock()
	stop()

	slices.Sort(sizes)
	t.Logf("%d events: batch consumer %.0f msgs/s (%d batches, size median %d, max %d), per-message inbox %.0f msgs/s: %.2f times",
		events, events/batched.Seconds(), len(sizes), sizes[len(sizes)/2], sizes[len(sizes)-1], events/single.Seconds(), single.Seconds()/batched.Seconds())
	// Generous, for a loaded machine: one subscription made it 0.014
	// times. watermill-amqp's default prefetch hands every waiting message
	// to one subscription, so batches hold one or two.
	require.Less(t, batched, 4*single, "the batch consumer is slower than a quarter of the per-message inbox")
}
