package loop_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/killtest"
	"github.com/watermill-inbox/inbox/internal/testdb"
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
	billing.run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, runConfig{})

	const n = 30
	ids := orders.placeOrders(t, topic, n)
	r.waitRelayed(t, n)
	b.waitDrained(t, "billing", topic)

	require.EqualValues(t, n/3, r.crashes.Load(), "relay crashes")
	require.EqualValues(t, n+r.crashes.Load(), b.records(topic), "Kafka holds every event plus the republished ones")
	billing.requireExactlyOnce(t, ids)
	require.EqualValues(t, n, billing.handled.Load())
	require.EqualValues(t, b.records(topic), billing.delivered.Load(), "every copy reached the inbox")
}

// childEnv carries the spec of a consumer process the test kills.
const childEnv = "INBOX_LOOP_KILLED_CONSUMER"

type childSpec struct {
	Brokers  []string
	DSN      string
	Service  string
	Inbox    string
	Effects  string
	Topic    string
	Group    string
	DieAfter int64
}

// Cause 2: the consumer commits its transaction and dies (SIGKILL, in a
// child process) before the offset is committed. The group redelivers; the
// inbox skips what the dead consumer committed and processes the rest.
//
// The test binary runs itself as the child: with childEnv set, this test is
// the consumer that kills itself.
func TestConsumerKilledBeforeOffsetCommit(t *testing.T) {
	var spec childSpec
	if killtest.Spec(t, childEnv, &spec) {
		runKilledConsumer(t, spec)
		return
	}
	t.Parallel()
	f := setup(t)
	db, b, topic, billing := f.db, f.broker, f.topic, f.billing
	ids := publishEvents(t, kafkaPublisher(t, b.addrs), topic, 40)

	appName := testdb.Name("killed")
	killtest.Run(t, "TestConsumerKilledBeforeOffsetCommit", childEnv, childSpec{
		Brokers: b.addrs, DSN: withAppName(testdb.PostgresDSN(), appName),
		Service: billing.name, Inbox: billing.inbox, Effects: billing.effects,
		Topic: topic, Group: "billing", DieAfter: 15,
	}, waitFor)

	// Its connections are gone once PostgreSQL has finished (committed or
	// rolled back) every transaction the child had open.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n))
		return n == 0
	}, waitFor, 20*time.Millisecond)
	committedByChild := billing.effectRows(t)
	offsetsCommitted := b.committed("billing", topic)
	require.GreaterOrEqual(t, committedByChild, 15)
	require.Positive(t, offsetsCommitted, "the child committed the offsets of the messages it acked")
	require.Less(t, offsetsCommitted, int64(committedByChild), "the last effect committed before its offset")

	billing.run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, runConfig{})
	b.waitDrained(t, "billing", topic)

	billing.requireExactlyOnce(t, ids)
	require.EqualValues(t, len(ids)-committedByChild, billing.handled.Load(), "the restarted consumer handled only the rest")
	skipped := billing.delivered.Load() - billing.handled.Load()
	require.GreaterOrEqual(t, skipped, int64(committedByChild)-offsetsCommitted, "redelivered events the child had committed were skipped")
	t.Logf("child committed %d effects, %d offsets; restarted consumer handled %d, skipped %d duplicates",
		committedByChild, offsetsCommitted, billing.handled.Load(), skipped)
}

func runKilledConsumer(t *testing.T, spec childSpec) {
	db := testdb.Open(t, "pgx", spec.DSN)
	s := openService(t, db, spec.Service, spec.Inbox, spec.Effects)
	// Commit each offset right after its ack, so the offsets of all but the
	// messages in flight at the kill are committed.
	config := saramaConsumerConfig()
	config.Consumer.Offsets.AutoCommit.Enable = false
	var n atomic.Int64
	s.run(t, kafkaSubscriberWith(t, spec.Brokers, spec.Group, config), spec.Topic, runConfig{
		afterEffect: func(msg *message.Message) error {
			if n.Add(1) != spec.DieAfter {
				return nil
			}
			// Committed, not yet acked: the offset is never committed.
			return inbox.AfterCommit(msg.Context(), killtest.Kill)
		},
	})
	time.Sleep(waitFor)
	t.Fatalf("consumer handled %d messages and was not killed", n.Load())
}

// withAppName tags a PostgreSQL DSN so the test can find its connections.
func withAppName(dsn, name string) string {
	if !strings.Contains(dsn, "://") {
		return dsn + " application_name=" + name
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&application_name=" + name
	}
	return dsn + "?application_name=" + name
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
	stopFirst := billing.run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, runConfig{outer: holdTenth})
	ids := publishEvents(t, pub, topic, 30)
	<-tenth
	generation := b.GroupInfo("billing").Epoch
	billing.run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, runConfig{})
	// The first member cannot rejoin while it holds a message, so the new
	// generation forms without it (after the rebalance timeout): its session
	// is over before it acks.
	_, err := b.WaitGroupInfo(t.Context(), "billing", func(g *kfake.GroupInfo) bool {
		return g != nil && g.State == "Stable" && g.Epoch > generation
	})
	require.NoError(t, err)
	close(rebalancing)
	billing.waitEffects(t, 20)
	// A third member joins, then the first one leaves, while events keep
	// coming.
	billing.run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, runConfig{})
	ids = append(ids, publishEvents(t, pub, topic, 30)...)
	stopFirst()
	ids = append(ids, publishEvents(t, pub, topic, 30)...)
	b.waitDrained(t, "billing", topic)

	billing.requireExactlyOnce(t, ids)
	// A leaving member's subscriber cancels the context of the messages it
	// has in flight; with pgx the COMMIT is bound to it and may report
	// "context canceled" after it happened. The outcome is unknown, the
	// message is nacked, its redelivery finds the claim: one effect, but
	// the handler's AfterCommit hook (our counter) did not run.
	require.LessOrEqual(t, billing.handled.Load(), int64(len(ids)))
	skipped := billing.delivered.Load() - billing.handled.Load()
	require.Positive(t, skipped, "the rebalance redelivered committed events")
	t.Logf("%d events, %d deliveries, %d duplicates skipped", len(ids), billing.delivered.Load(), skipped)
}

// Cause 4: an operator replays the topic from the oldest offset with a new
// consumer group, keeping the inbox consumer name. Every event is delivered
// again; none has a second effect.
func TestOperatorReplaysTopic(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b, topic, billing := f.broker, f.topic, f.billing
	ids := publishEvents(t, kafkaPublisher(t, b.addrs), topic, 40)

	stop := billing.run(t, kafkaSubscriber(t, b.addrs, "billing"), topic, runConfig{})
	b.waitDrained(t, "billing", topic)
	stop()
	billing.requireExactlyOnce(t, ids)
	require.EqualValues(t, len(ids), billing.handled.Load())

	// Same handler name, hence same inbox consumer; new group from the
	// oldest offset (Consumer.Offsets.Initial = OffsetOldest).
	billing.run(t, kafkaSubscriber(t, b.addrs, "billing-replay"), topic, runConfig{})
	b.waitDrained(t, "billing-replay", topic)

	billing.requireExactlyOnce(t, ids)
	require.EqualValues(t, len(ids), billing.handled.Load(), "the replay handled nothing")
	require.EqualValues(t, 2*len(ids), billing.delivered.Load(), "the replay delivered every event again")
}
