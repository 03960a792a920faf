package stream

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
)

// Stream is a topic of an in-process Kafka broker and the consumer group
// that reads it.
type Stream struct {
	Broker     *kfake.Cluster // nil in a child process, which reaches it at Addrs
	Addrs      []string
	Topic      string
	Group      string
	Partitions int
	Events     int // unique events published
	Deliveries int // records published, copies included
}

// New starts a broker with a topic of partitions partitions; it is closed
// when the test ends.
func New(t testing.TB, partitions int) *Stream {
	t.Helper()
	b, err := kafkatest.NewCluster()
	require.NoError(t, err)
	t.Cleanup(b.Close)
	s := &Stream{Broker: b, Addrs: b.ListenAddrs(), Topic: testdb.Name("stream"), Group: testdb.Name("group"), Partitions: partitions}
	require.NoError(t, b.CreateTopic(s.Topic, int32(partitions), nil))
	return s
}

// EventID is the id of the i-th event of a stream.
func EventID(i int) string { return fmt.Sprintf("e%d", i) }

// Publish publishes events events, ids EventID(first..first+events-1), and
// copies of recent ones among them (a relay republishing after a crash), deliveries
// records in all. Each copy has a new message UUID and the event's
// event_id, as a relay retry builds it; records go round-robin, so copies
// usually land on another partition than the original and race it.
func Publish(ctx context.Context, addrs []string, topic string, first, events, deliveries int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	var failed atomic.Pointer[error]
	produce := func(event int) {
		rec := &kgo.Record{Value: []byte(`{}`), Headers: []kgo.RecordHeader{
			{Key: kafka.UUIDHeaderKey, Value: []byte(watermill.NewUUID())},
			{Key: "event_id", Value: []byte(EventID(first + event))},
		}}
		cl.Produce(ctx, rec, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.CompareAndSwap(nil, &err)
			}
		})
	}
	dups := deliveries - events
	const window = 2000 // copies repeat one of the last window events
	for i := range events {
		produce(i)
		for range (i+1)*dups/events - i*dups/events {
			produce(max(0, i-rand.IntN(min(window, i+1))))
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if p := failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Publish publishes events more events with copies, deliveries records in
// all (see the function Publish).
func (s *Stream) Publish(t testing.TB, events, deliveries int) {
	t.Helper()
	require.NoError(t, Publish(context.Background(), s.Addrs, s.Topic, s.Events, events, deliveries))
	s.Events, s.Deliveries = s.Events+events, s.Deliveries+deliveries
}

// Records is the number of records the topic holds.
func (s *Stream) Records() int64 {
	var n int64
	for _, p := range s.Broker.PartitionInfos(s.Topic) {
		n += p.HighWatermark
	}
	return n
}

// Committed is the number of records the group has committed.
func (s *Stream) Committed() int64 {
	g := s.Broker.GroupInfo(s.Group)
	if g == nil {
		return 0
	}
	var n int64
	for _, c := range g.Commits[s.Topic] {
		n += c.Offset
	}
	return n
}

// WaitDrained waits until the group has committed every record: every
// delivery, redeliveries included, was handled and acked. It fails when
// nothing moved for stall.
func (s *Stream) WaitDrained(t testing.TB, stall time.Duration) {
	t.Helper()
	last, lastMove := int64(-1), time.Now()
	for {
		n := s.Committed()
		if n == s.Records() {
			return
		}
		if n != last {
			last, lastMove = n, time.Now()
		}
		require.Less(t, time.Since(lastMove), stall, "the group stalled at %d of %d records", n, s.Records())
		time.Sleep(20 * time.Millisecond)
	}
}
