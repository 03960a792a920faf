package loop_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Cause 1: the relay publishes an event, crashes before recording that it
// did, and publishes it again. Kafka holds both copies; the consumer applies
// the effect once.
func TestRelayPublishesTwice(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b, topic, billing := f.broker, f.topic, f.billing
	o := newOutbox(t, f.db)
	orders := newOrderService(t, f.db, o)
	r := startRelay(t, o, b.addrs, 3)
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, effects.RunConfig{})

	const n = 30
	ids := orders.placeOrders(t, topic, n)
	r.waitRelayed(t, n)
	b.waitDrained(t, "billing", topic)

	require.EqualValues(t, n/3, r.crashes.Load(), "relay crashes")
	require.EqualValues(t, n+r.crashes.Load(), b.records(topic), "Kafka holds every event plus the republished ones")
	billing.RequireExactlyOnce(t, ids)
	require.EqualValues(t, n, billing.Handled.Load())
	require.EqualValues(t, b.records(topic), billing.Delivered.Load(), "every copy reached the inbox")
}

// Cause 2: the consumer commits its transaction and dies (SIGKILL, in a
// child process) before the offset is committed. The group redelivers; the
// inbox skips what the dead consumer committed and processes the rest.
//
// The test binary runs itself as the child (killtest): there, this test is
// the consumer that kills itself.
func TestConsumerKilledBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	for _, layout := range []struct {
		name   string
		config sqlinbox.Config
	}{
		{"plain", sqlinbox.Config{}},
		// The time-keyed claim commits with the effect as the plain one does.
		{"event-time-partitions", sqlinbox.Config{Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime}},
	} {
		t.Run(layout.name, func(t *testing.T) {
			if killtest.ConsumeUntilKilled(t, func(c killtest.Consumer) message.Subscriber {
				// Commit each offset right after its ack, so the offsets of all but
				// the messages in flight at the kill are committed.
				config := saramaConsumerConfig()
				config.Consumer.Offsets.AutoCommit.Enable = false
				return kafkaSubscriberWith(t, strings.Split(c.Server, ","), "billing", config)
			}) {
				return
			}
			t.Parallel()
			f := setupWith(t, layout.config)
			consumerKilledBeforeOffsetCommit(t, f)
			if layout.config.PartitionKey == sqlinbox.EventIDTime {
				var inDefault int
				require.NoError(t, f.db.QueryRow(`SELECT count(*) FROM `+f.billing.Inbox+`_default`).Scan(&inDefault))
				require.Zero(t, inDefault, "every claim in the partition of its id's day")
			}
		})
	}
}

func consumerKilledBeforeOffsetCommit(t *testing.T, f fixture) {
	b, topic, billing := f.broker, f.topic, f.billing
	ids := effects.PublishEvents(t, kafkaPublisher(t, b.addrs), topic, 40)

	// Committed, not yet acked: its offset is never committed.
	committedByChild := killtest.KillConsumer(t, billing, strings.Join(b.addrs, ","), topic, 15)
	offsetsCommitted := b.committed("billing", topic)
	require.Positive(t, offsetsCommitted, "the child committed the offsets of the messages it acked")
	require.Less(t, offsetsCommitted, int64(committedByChild), "the last effect committed before its offset")

	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, effects.RunConfig{})
	b.waitDrained(t, "billing", topic)

	billing.RequireExactlyOnce(t, ids)
	require.EqualValues(t, len(ids)-committedByChild, billing.Handled.Load(), "the restarted consumer handled only the rest")
	skipped := billing.Delivered.Load() - billing.Handled.Load()
	require.GreaterOrEqual(t, skipped, int64(committedByChild)-offsetsCommitted, "redelivered events the child had committed were skipped")
	t.Logf("child committed %d effects, %d offsets; restarted consumer handled %d, skipped %d duplicates",
		committedByChild, offsetsCommitted, billing.Handled.Load(), skipped)
}

// Cause 3: members join and leave the consumer group mid-stream. A member
// whose partitions are revoked while it handles a message commits the
// effect but cannot commit the offset; the partition's next owner gets the
// message again.
func TestConsumerGroupRebalance(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b, topic, billing := f.broker, f.topic, f.billing
	pub := kafkaPublisher(t, b.addrs)

	// The first member holds its 10th message, already committed, until a
	// second member has joined and the group is rebalancing, so its ack
	// comes after its partitions were revoked.
	var handledByFirst atomic.Int64
	tenth, rebalancing := make(chan struct{}), make(chan struct{})
	holdTenth := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && handledByFirst.Add(1) == 10 {
				close(tenth)
				select {
				case <-rebalancing:
				case <-time.After(waitFor):
				}
			}
			return out, err
		}
	}
	stopFirst := billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, effects.RunConfig{Outer: holdTenth})
	ids := effects.PublishEvents(t, pub, topic, 30)
	<-tenth
	generation := b.GroupInfo("billing").Epoch
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, effects.RunConfig{})
	// The first member cannot rejoin while it holds a message, so the new
	// generation forms without it (after the rebalance timeout): its session
	// is over before it acks.
	_, err := b.WaitGroupInfo(t.Context(), "billing", func(g *kfake.GroupInfo) bool {
		return g != nil && g.State == "Stable" && g.Epoch > generation
	})
	require.NoError(t, err)
	close(rebalancing)
	billing.WaitEffects(t, 20)
	// A third member joins, then the first one leaves, while events keep
	// coming.
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, effects.RunConfig{})
	ids = append(ids, effects.PublishEvents(t, pub, topic, 30)...)
	stopFirst()
	ids = append(ids, effects.PublishEvents(t, pub, topic, 30)...)
	b.waitDrained(t, "billing", topic)

	billing.RequireExactlyOnce(t, ids)
	// A leaving member's subscriber cancels the context of the messages it
	// has in flight; with pgx the COMMIT is bound to it and may report
	// "context canceled" after it happened. The outcome is unknown, the
	// message is nacked, its redelivery finds the claim: one effect, but
	// the handler's AfterCommit hook (our counter) did not run.
	require.LessOrEqual(t, billing.Handled.Load(), int64(len(ids)))
	skipped := billing.Delivered.Load() - billing.Handled.Load()
	require.Positive(t, skipped, "the rebalance redelivered committed events")
	t.Logf("%d events, %d deliveries, %d duplicates skipped", len(ids), billing.Delivered.Load(), skipped)
}

// Cause 4: an operator replays the topic from the oldest offset with a new
// consumer group, keeping the inbox consumer name. Every event is delivered
// again; none has a second effect.
func TestOperatorReplaysTopic(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b, topic, billing := f.broker, f.topic, f.billing
	ids := effects.PublishEvents(t, kafkaPublisher(t, b.addrs), topic, 40)

	stop := billing.Run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, effects.RunConfig{})
	b.waitDrained(t, "billing", topic)
	stop()
	billing.RequireExactlyOnce(t, ids)
	require.EqualValues(t, len(ids), billing.Handled.Load())

	// Same handler name, hence same inbox consumer; new group from the
	// oldest offset (Consumer.Offsets.Initial = OffsetOldest).
	billing.Run(t, kafkaSubscriber(t, b.addrs, "billing-replay"), topic, effects.RunConfig{})
	b.waitDrained(t, "billing-replay", topic)

	billing.RequireExactlyOnce(t, ids)
	require.EqualValues(t, len(ids), billing.Handled.Load(), "the replay handled nothing")
	require.EqualValues(t, 2*len(ids), billing.Delivered.Load(), "the replay delivered every event again")
}
