package brokers_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
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
				sizes := runBatches(t, sub, topic, runSubs, events)
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

// runBatches runs a batch consumer on topic until it handled events
// distinct events, and returns the size of every batch handed over.
func runBatches(t *testing.T, sub message.Subscriber, topic string, subscriptions, events int) []int {
	db, err := sql.Open("sqlite", sqlinbox.SQLiteDSN(testdb.SQLiteFile(t)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var (
		mu    sync.Mutex
		sizes []int
		seen  = map[string]int{}
	)
	c, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: store, Consumer: "batch", MaxSize: 100, MaxWait: 50 * time.Millisecond, Subscriptions: subscriptions},
		func(ctx context.Context, msgs []*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(msgs))
			for _, msg := range msgs {
				seen[msg.Metadata.Get(inbox.DefaultEventIDMetadataKey)]++
			}
			if len(seen) == events {
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
	return slices.Clone(sizes)
}
