package brokers_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/sources/amqpsource"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// batchReplica is a BatchConsumer of an effects.Service reading a batch
// source (sources/...): one effect row per new message, written in the
// batch's transaction.
type batchReplica struct {
	mu      sync.Mutex
	sizes   []int // of every batch the handler got
	handled atomic.Int64
}

// run starts the replica reading topic from sub until the test ends;
// fail, when set, makes the handler fail on a message.
func (r *batchReplica) run(t *testing.T, s *effects.Service, sub message.Subscriber, queue string, config inbox.BatchConfig, fail func(*message.Message) error) {
	t.Helper()
	config.Store, config.Consumer, config.Observer = s.Store, s.Name, s
	c, err := inbox.NewBatchConsumer(config, r.handler(s, fail))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, sub, queue) }()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		require.NoError(t, sub.Close())
	})
}

func (r *batchReplica) handler(s *effects.Service, fail func(*message.Message) error) inbox.BatchHandlerFunc {
	return func(ctx context.Context, msgs []*message.Message) error {
		r.mu.Lock()
		r.sizes = append(r.sizes, len(msgs))
		r.mu.Unlock()
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return errors.New("no inbox transaction")
		}
		for _, msg := range msgs {
			if fail != nil {
				if err := fail(msg); err != nil {
					return err
				}
			}
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.Effects+` (event_id) VALUES ($1)`, id); err != nil {
				return err
			}
		}
		n := int64(len(msgs))
		return inbox.AfterCommit(ctx, func(context.Context) error { r.handled.Add(n); return nil })
	}
}

// batchLedger is a service on PostgreSQL, a queue and a watermill-amqp
// publisher to it.
func batchLedger(t *testing.T) (*effects.Service, string, message.Publisher) {
	t.Helper()
	s := effects.NewService(t, testdb.Postgres(t, "pgx"), "ledger")
	return s, amqpQueue(t), amqpPublisher(t, amqpConfig(amqpURL(), 1))
}

// settled waits until the batch consumers told s the outcome of n
// messages, and checks they tell no more.
func settled(t *testing.T, s *effects.Service, n int64) {
	t.Helper()
	ended := func() (sum int64) {
		for _, c := range s.Outcomes() {
			sum += c
		}
		return sum
	}
	require.Eventually(t, func() bool { return ended() >= n }, effects.WaitFor, 10*time.Millisecond)
	require.Equal(t, n, ended(), "outcomes: %v", s.Outcomes())
}

// amqpSource is an amqpsource subscriber.
func amqpSource(t *testing.T) message.Subscriber {
	t.Helper()
	sub, err := amqpsource.NewSubscriber(amqpsource.Config{URL: amqpURL(), Logger: logger})
	require.NoError(t, err, "no RabbitMQ answers at %s (run ./test.sh, which starts one)", amqpURL())
	return sub
}

// maxSize is the largest batch the replica got.
func (r *batchReplica) maxSize() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Max(append([]int{0}, r.sizes...))
}

// batchChild is the spec of a batch consumer child that kills itself.
type batchChild struct {
	Broker, Topic, DSN, Service, Inbox, Effects string
}

// batchSource is a batch source on its broker: a service with a topic
// and a publisher to it, and a subscriber to the topic, the same durable
// for every call of a test.
type batchSource struct {
	name       string // the key in batchSources
	ledger     func(t *testing.T) (*effects.Service, string, message.Publisher)
	subscriber func(t *testing.T, topic string) message.Subscriber
	topic      func(t *testing.T) string // another topic
}

var batchSources = map[string]batchSource{
	"RabbitMQ": {"", batchLedger, func(t *testing.T, _ string) message.Subscriber { return amqpSource(t) }, amqpQueue},
	"NATS": {"", natsLedger, func(t *testing.T, topic string) message.Subscriber { return natsSource(t, topic, 2*time.Second) },
		func(t *testing.T) string { return natsStream(t, natsURL(), 1) }},
}

// forEachSource runs test on every batch source in parallel, each with a
// service, a topic and a publisher to it.
func forEachSource(t *testing.T, test func(t *testing.T, source batchSource, s *effects.Service, topic string, pub message.Publisher)) {
	t.Parallel()
	for broker, source := range batchSources {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			source.name = broker
			s, topic, pub := source.ledger(t)
			test(t, source, s, topic, pub)
		})
	}
}

// Every event once, from full batches: 1,000 events published by the
// broker's Watermill publisher, read by two replicas of a batch consumer
// with MaxSize 100, the second joining once the first has committed
// events. Batches reach 100, where Watermill's subscribers hand a
// subscription's next message over only once the previous one is acked.
func TestBatchSourceFillsBatchesAcrossReplicas(t *testing.T) {
	forEachSource(t, func(t *testing.T, source batchSource, s *effects.Service, topic string, pub message.Publisher) {
		const events = 1000
		config := inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second}

		ids := effects.PublishEvents(t, pub, topic, events/2)
		var first, second batchReplica
		first.run(t, s, source.subscriber(t, topic), topic, config, nil)
		require.Eventually(t, func() bool { return first.handled.Load() > 0 }, effects.WaitFor, 10*time.Millisecond)
		second.run(t, s, source.subscriber(t, topic), topic, config, nil)
		ids = append(ids, effects.PublishEvents(t, pub, topic, events/2)...)

		require.Eventually(t, func() bool { return first.handled.Load()+second.handled.Load() == events }, effects.WaitFor, 10*time.Millisecond)
		settled(t, s, events)
		s.RequireExactlyOnce(t, ids)
		require.Positive(t, second.handled.Load(), "the replica that joined got events")
		require.Equal(t, 100, first.maxSize(), "first replica's largest batch")
		t.Logf("first replica: %d events, batches %v; second: %d events, batches %v", first.handled.Load(), first.sizes, second.handled.Load(), second.sizes)
	})
}

// A consumer SIGKILLed between a batch's commit and its acks: the broker
// delivers the batch's 100 messages again (RabbitMQ at once, as the
// channel closed; JetStream after AckWait), with the next ones it had
// handed over, and the next consumer finds the 100 all duplicates. Every
// event's effect is there once.
func TestBatchSourceKilledBetweenCommitAndAck(t *testing.T) {
	var spec batchChild
	if killtest.Child(&spec) {
		db := testdb.Open(t, "pgx", spec.DSN)
		s := effects.OpenService(t, db, spec.Service, spec.Inbox, spec.Effects, sqlinbox.Config{})
		var r batchReplica
		r.run(t, s, batchSources[spec.Broker].subscriber(t, spec.Topic), spec.Topic, inbox.BatchConfig{MaxSize: 100, MaxWait: 10 * time.Second}, func(msg *message.Message) error {
			return inbox.AfterCommit(msg.Context(), killtest.Kill)
		})
		killtest.Linger(t)
		return
	}
	forEachSource(t, func(t *testing.T, source batchSource, s *effects.Service, topic string, pub message.Publisher) {
		const events = 300
		ids := effects.PublishEvents(t, pub, topic, events)

		appName := testdb.Name("killed")
		killtest.Run(t, batchChild{Broker: source.name, Topic: topic, DSN: killtest.WithAppName(testdb.PostgresDSN(), appName), Service: s.Name, Inbox: s.Inbox, Effects: s.Effects})
		killtest.WaitDisconnected(t, s.DB, appName)
		require.Equal(t, 100, s.EffectRows(t), "the killed consumer committed one full batch")

		var r batchReplica
		r.run(t, s, source.subscriber(t, topic), topic, inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second}, nil)
		require.Eventually(t, func() bool { return r.handled.Load() == events-100 }, effects.WaitFor, 10*time.Millisecond)
		settled(t, s, events)
		require.Equal(t, map[observe.Outcome]int64{observe.Duplicate: 100, observe.Processed: events - 100}, s.Outcomes())
		s.RequireExactlyOnce(t, ids)
	})
}

// countingPublisher counts what it publishes.
type countingPublisher struct {
	message.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	if err == nil {
		p.n.Add(int64(len(msgs)))
	}
	return err
}

// A poison message inside a full batch: the batch rolls back and is
// split down to the message, which goes to the poison topic, acked; the
// 99 others commit once each.
func TestBatchSourcePoisonInsideBatch(t *testing.T) {
	forEachSource(t, func(t *testing.T, source batchSource, s *effects.Service, topic string, pub message.Publisher) {
		ids := effects.PublishEvents(t, pub, topic, 100)
		poison := ids[57]
		poisoned := &countingPublisher{Publisher: pub}
		var r batchReplica
		r.run(t, s, source.subscriber(t, topic), topic, inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second, PoisonPublisher: poisoned, PoisonTopic: source.topic(t)},
			func(msg *message.Message) error {
				if msg.UUID == poison {
					return errors.New("amount is not a number")
				}
				return nil
			})

		require.Eventually(t, func() bool { return r.handled.Load() == 99 && poisoned.n.Load() == 1 }, effects.WaitFor, 10*time.Millisecond)
		settled(t, s, 100)
		s.RequireExactlyOnce(t, slices.Delete(slices.Clone(ids), 57, 58))
		r.mu.Lock()
		defer r.mu.Unlock()
		require.Equal(t, 100, r.sizes[0], "the first batch was full")
	})
}

// Duplicates across batches: every event published twice, the copies a
// batch apart. The handler never sees a copy, each copy is acked as a
// duplicate, and every effect is there once.
func TestBatchSourceDuplicatesAcrossBatches(t *testing.T) {
	forEachSource(t, func(t *testing.T, source batchSource, s *effects.Service, topic string, pub message.Publisher) {
		const events = 300
		ids := effects.PublishEvents(t, pub, topic, events)
		for _, id := range ids {
			require.NoError(t, pub.Publish(topic, message.NewMessage(id, nil)))
		}
		var r batchReplica
		r.run(t, s, source.subscriber(t, topic), topic, inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second}, nil)

		require.Eventually(t, func() bool { return s.Outcomes()[observe.Duplicate] == events }, effects.WaitFor, 10*time.Millisecond)
		settled(t, s, 2*events)
		s.RequireExactlyOnce(t, ids)
		require.Equal(t, int64(events), r.handled.Load(), "messages the handler got")
	})
}
