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

// batchReplica is a BatchConsumer of an effects.Service reading RabbitMQ
// through amqpsource: one effect row per new message, written in the
// batch's transaction.
type batchReplica struct {
	mu      sync.Mutex
	sizes   []int // of every batch the handler got
	handled atomic.Int64
}

// run starts the replica on queue until the test ends; fail, when set,
// makes the handler fail on a message.
func (r *batchReplica) run(t *testing.T, s *effects.Service, queue string, config inbox.BatchConfig, fail func(*message.Message) error) {
	t.Helper()
	config.Store, config.Consumer, config.Observer = s.Store, s.Name, s
	c, err := inbox.NewBatchConsumer(config, r.handler(s, fail))
	require.NoError(t, err)
	sub, err := amqpsource.NewSubscriber(amqpsource.Config{URL: amqpURL(), Logger: logger})
	require.NoError(t, err, "no RabbitMQ answers at %s (run ./test.sh, which starts one)", amqpURL())
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

// maxSize is the largest batch the replica got.
func (r *batchReplica) maxSize() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Max(append([]int{0}, r.sizes...))
}

// Every event once, from full batches: 1,000 events published by a
// watermill-amqp publisher, read by two replicas of a batch consumer with
// MaxSize 100, the second joining once the first has committed events.
// Both fill batches of 100, which Watermill's AMQP subscriber, acking one
// delivery before taking the next, never does.
func TestAMQPSourceFillsBatchesAcrossReplicas(t *testing.T) {
	t.Parallel()
	const events = 1000
	s, queue, pub := batchLedger(t)
	config := inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second}

	ids := effects.PublishEvents(t, pub, queue, events/2)
	var first, second batchReplica
	first.run(t, s, queue, config, nil)
	require.Eventually(t, func() bool { return first.handled.Load() > 0 }, effects.WaitFor, 10*time.Millisecond)
	second.run(t, s, queue, config, nil)
	ids = append(ids, effects.PublishEvents(t, pub, queue, events/2)...)

	require.Eventually(t, func() bool { return first.handled.Load()+second.handled.Load() == events }, effects.WaitFor, 10*time.Millisecond)
	settled(t, s, events)
	s.RequireExactlyOnce(t, ids)
	require.Positive(t, second.handled.Load(), "the replica that joined got events")
	require.Equal(t, 100, first.maxSize(), "first replica's largest batch")
	require.Equal(t, 100, second.maxSize(), "second replica's largest batch")
	t.Logf("first replica: %d events, batches %v; second: %d events, batches %v", first.handled.Load(), first.sizes, second.handled.Load(), second.sizes)
}

// A poison message inside a full batch: the batch rolls back and is
// split down to the message, which goes to the poison queue, acked; the
// 99 others commit once each.
func TestAMQPSourcePoisonInsideBatch(t *testing.T) {
	t.Parallel()
	s, queue, pub := batchLedger(t)
	poisonQueue := amqpQueue(t)
	ids := effects.PublishEvents(t, pub, queue, 100)
	poison := ids[57]
	var r batchReplica
	r.run(t, s, queue, inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second, PoisonPublisher: pub, PoisonTopic: poisonQueue},
		func(msg *message.Message) error {
			if msg.UUID == poison {
				return errors.New("amount is not a number")
			}
			return nil
		})

	require.Eventually(t, func() bool { return r.handled.Load() == 99 && amqpReady(t, poisonQueue) == 1 }, effects.WaitFor, 10*time.Millisecond)
	settled(t, s, 100)
	s.RequireExactlyOnce(t, slices.Delete(slices.Clone(ids), 57, 58))
	require.Equal(t, 100, r.sizes[0], "the first batch was full")
	require.Equal(t, 0, amqpReady(t, queue), "nothing requeued")
}

// Duplicates across batches: every event published twice, the copies a
// batch apart. The handler never sees a copy, each copy is acked as a
// duplicate, and every effect is there once.
func TestAMQPSourceDuplicatesAcrossBatches(t *testing.T) {
	t.Parallel()
	const events = 300
	s, queue, pub := batchLedger(t)
	ids := effects.PublishEvents(t, pub, queue, events)
	for _, id := range ids {
		require.NoError(t, pub.Publish(queue, message.NewMessage(id, nil)))
	}
	var r batchReplica
	r.run(t, s, queue, inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second}, nil)

	require.Eventually(t, func() bool { return s.Outcomes()[observe.Duplicate] == events }, effects.WaitFor, 10*time.Millisecond)
	settled(t, s, 2*events)
	s.RequireExactlyOnce(t, ids)
	require.Equal(t, int64(events), r.handled.Load(), "messages the handler got")
	require.Equal(t, 0, amqpReady(t, queue), "nothing requeued")
}

// batchChild is the spec of a batch consumer child that kills itself.
type batchChild struct {
	Queue, DSN, Service, Inbox, Effects string
}

// A consumer SIGKILLed between a batch's commit and its acks: RabbitMQ
// requeues the batch's 100 deliveries (and the next ones it had
// prefetched), and the next consumer finds the 100 all duplicates. Every
// event's effect is there once.
func TestAMQPSourceKilledBetweenCommitAndAck(t *testing.T) {
	var spec batchChild
	if killtest.Child(&spec) {
		db := testdb.Open(t, "pgx", spec.DSN)
		s := effects.OpenService(t, db, spec.Service, spec.Inbox, spec.Effects, sqlinbox.Config{})
		var r batchReplica
		r.run(t, s, spec.Queue, inbox.BatchConfig{MaxSize: 100, MaxWait: 10 * time.Second}, func(msg *message.Message) error {
			return inbox.AfterCommit(msg.Context(), killtest.Kill)
		})
		killtest.Linger(t)
		return
	}
	t.Parallel()
	const events = 300
	s, queue, pub := batchLedger(t)
	ids := effects.PublishEvents(t, pub, queue, events)

	appName := testdb.Name("killed")
	killtest.Run(t, batchChild{Queue: queue, DSN: killtest.WithAppName(testdb.PostgresDSN(), appName), Service: s.Name, Inbox: s.Inbox, Effects: s.Effects})
	killtest.WaitDisconnected(t, s.DB, appName)
	require.Equal(t, 100, s.EffectRows(t), "the killed consumer committed one full batch")

	var r batchReplica
	r.run(t, s, queue, inbox.BatchConfig{MaxSize: 100, MaxWait: time.Second}, nil)
	require.Eventually(t, func() bool { return r.handled.Load() == events-100 }, effects.WaitFor, 10*time.Millisecond)
	settled(t, s, events)
	require.Equal(t, map[observe.Outcome]int64{observe.Duplicate: 100, observe.Processed: events - 100}, s.Outcomes())
	s.RequireExactlyOnce(t, ids)
	require.Equal(t, 0, amqpReady(t, queue), "nothing requeued")
}
