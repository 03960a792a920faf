package loop_test

import (
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Group timings come from kafkatest: a member that dies (SIGKILL) is
// expired in about kafkatest.SessionTimeout instead of Kafka's usual 10s or
// more.
const (
	partitions = 4
	waitFor    = 30 * time.Second
)

var logger = watermill.NopLogger{}

// broker is an in-process Kafka-protocol broker.
type broker struct {
	*kfake.Cluster
	addrs []string
}

func newBroker(t testing.TB) *broker {
	t.Helper()
	c, err := kafkatest.NewCluster()
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return &broker{Cluster: c, addrs: c.ListenAddrs()}
}

// topic creates a topic with a unique name.
func (b *broker) topic(t testing.TB, prefix string) string {
	t.Helper()
	name := testdb.Name(prefix)
	require.NoError(t, b.CreateTopic(name, partitions, nil))
	return name
}

// records is the number of records topic holds: every publish, duplicates
// included.
func (b *broker) records(topic string) int64 {
	var n int64
	for _, p := range b.PartitionInfos(topic) {
		n += p.HighWatermark - p.LogStartOffset
	}
	return n
}

// committed is the number of records of topic that group has committed.
func (b *broker) committed(group, topic string) int64 {
	g := b.GroupInfo(group)
	if g == nil {
		return 0
	}
	var n int64
	for _, c := range g.Commits[topic] {
		n += c.Offset
	}
	return n
}

// waitDrained waits until group has committed every record of topic, so
// every delivery, redeliveries included, has been handled and acked.
func (b *broker) waitDrained(t testing.TB, group, topic string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, p := range b.PartitionInfos(topic) {
			g := b.GroupInfo(group)
			if g == nil || g.Commits[topic][p.Partition].Offset != p.HighWatermark {
				return false
			}
		}
		return true
	}, waitFor, 20*time.Millisecond, "group %s did not commit all of %s", group, topic)
}

func saramaConsumerConfig() *sarama.Config {
	return kafkatest.SubscriberConfig(time.Second)
}

func kafkaPublisher(t testing.TB, addrs []string) *kafka.Publisher {
	t.Helper()
	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               addrs,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: c,
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

func kafkaSubscriber(t testing.TB, addrs []string, group string) *kafka.Subscriber {
	t.Helper()
	return kafkaSubscriberWith(t, addrs, group, saramaConsumerConfig())
}

func kafkaSubscriberWith(t testing.TB, addrs []string, group string, config *sarama.Config) *kafka.Subscriber {
	t.Helper()
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               addrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: config,
		ConsumerGroup:         group,
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// fixture is what every cause test starts with: PostgreSQL, a broker, a
// topic and the billing service that consumes it.
type fixture struct {
	db      *stdsql.DB
	broker  *broker
	topic   string
	billing *effects.Service
}

func setup(t testing.TB) fixture {
	t.Helper()
	return setupWith(t, sqlinbox.Config{})
}

// setupWith is setup with the billing service's store configured as config.
func setupWith(t testing.TB, config sqlinbox.Config) fixture {
	t.Helper()
	db := testdb.Postgres(t, "pgx")
	b := newBroker(t)
	return fixture{db: db, broker: b, topic: b.topic(t, "orders"), billing: effects.NewServiceWith(t, db, "billing", config)}
}

// outbox is a watermill-sql outbox, built as its configuration says and
// fronted by Watermill's forwarder: producers publish enveloped messages to
// one SQL topic in their own transaction, and the relay publishes each to
// the destination topic named in its envelope.
type outbox struct {
	db     *stdsql.DB
	config outboxConfig
	topic  string // the SQL topic; its table is watermill_<topic>
}

// newOutbox is newOutboxWith watermill-sql v4 on PostgreSQL.
func newOutbox(t testing.TB, db *stdsql.DB) *outbox {
	t.Helper()
	return newOutboxWith(t, db, postgresV4)
}

// newOutboxWith creates the outbox tables up front: a publisher bound to a
// transaction must not create them itself (watermill-sql refuses
// AutoInitializeSchema with a transaction).
func newOutboxWith(t testing.TB, db *stdsql.DB, config outboxConfig) *outbox {
	t.Helper()
	o := &outbox{db: db, config: config, topic: testdb.Name("outbox")}
	t.Cleanup(func() { _, _ = db.Exec(config.drop(o.topic)) })
	sub := o.subscriber(t)
	require.NoError(t, sub.SubscribeInitialize(o.topic))
	require.NoError(t, sub.Close())
	return o
}

// publisher returns an outbox publisher bound to tx: what it publishes
// commits or rolls back with tx.
func (o *outbox) publisher(tx *stdsql.Tx) (message.Publisher, error) {
	pub, err := o.config.publisher(tx)
	if err != nil {
		return nil, err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: o.topic}), nil
}

// subscriber is a relay's subscriber. Give it to a router, which closes
// it (closing a v3 subscriber twice is a data race).
func (o *outbox) subscriber(t testing.TB) subscriber {
	t.Helper()
	sub, err := o.config.relay(o.db)
	require.NoError(t, err)
	return sub
}

// pending is the number of outbox rows the relay has not acked.
func (o *outbox) pending(t testing.TB) int {
	t.Helper()
	return o.config.pendingRows(t, o.db, o.topic)
}

// relay is Watermill's forwarder from an outbox to Kafka. It can crash after
// publishing and before acking the outbox row, so the row is published again.
type relay struct {
	published   atomic.Int64 // publishes to Kafka, republishes included
	rows        atomic.Int64 // distinct outbox rows published
	crashes     atomic.Int64 // crashes injected after a publish
	republished atomic.Int64 // crashed rows published again
	stop        func()       // closes the relay gracefully and waits until it stopped
}

// startRelay runs a relay from o to Kafka that crashes after publishing
// every crashEvery-th row (0: never).
func startRelay(t testing.TB, o *outbox, addrs []string, crashEvery int) *relay {
	t.Helper()
	return startRelayWith(t, o, kafkaPublisher(t, addrs), relayOptions{crashEvery: crashEvery})
}

// relayOptions shape a relay's failures.
type relayOptions struct {
	crashEvery int                       // crash after publishing every crashEvery-th row (0: never)
	after      message.HandlerMiddleware // runs around each publish, inside the crash
}

// startRelayWith runs a relay from o to pub.
func startRelayWith(t testing.TB, o *outbox, pub message.Publisher, opts relayOptions) *relay {
	t.Helper()
	crashEvery := opts.crashEvery
	r := &relay{}
	var mu sync.Mutex
	crashed := map[string]bool{} // envelope uuid -> republished yet
	crash := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			r.published.Add(1)
			mu.Lock()
			defer mu.Unlock()
			if republished, ok := crashed[msg.UUID]; ok {
				if !republished {
					crashed[msg.UUID] = true
					r.republished.Add(1)
				}
				return out, nil
			}
			if n := r.rows.Add(1); crashEvery > 0 && n%int64(crashEvery) == 0 {
				crashed[msg.UUID] = false
				r.crashes.Add(1)
				return nil, errors.New("relay crashed after publishing, before acking the outbox row")
			}
			return out, nil
		}
	}
	mws := []message.HandlerMiddleware{crash}
	if opts.after != nil {
		mws = append(mws, opts.after)
	}
	// Closed as docs/outbox.md tells users: the subscription's context
	// ends first, so a batch in flight rolls back.
	fwd, err := forwarder.NewForwarder(inbox.RelaySubscriber(o.subscriber(t)), pub, logger, forwarder.Config{
		ForwarderTopic: o.topic,
		Middlewares:    mws,
		CloseTimeout:   10 * time.Second,
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- fwd.Run(context.Background()) }()
	select {
	case <-fwd.Running():
	case err := <-done:
		t.Fatalf("relay stopped at start: %v", err)
	}
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			_ = fwd.Close()
			<-done
		})
	}
	t.Cleanup(r.stop)
	return r
}

// waitRelayed waits until the relay has published rows distinct outbox
// rows and republished every row it crashed on.
func (r *relay) waitRelayed(t testing.TB, rows int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return r.rows.Load() == int64(rows) && r.republished.Load() == r.crashes.Load()
	}, waitFor, 20*time.Millisecond, "relay published %d of %d rows and republished %d of %d crashed rows",
		r.rows.Load(), rows, r.republished.Load(), r.crashes.Load())
}

// orderService is service A: it writes a business row and its event to the
// outbox in one transaction.
type orderService struct {
	db     *stdsql.DB
	orders string
	outbox *outbox
}

func newOrderService(t testing.TB, db *stdsql.DB, o *outbox) *orderService {
	t.Helper()
	a := &orderService{db: db, orders: testdb.Table(t, db, "orders"), outbox: o}
	ddl := `CREATE TABLE ` + a.orders + ` (id bigserial PRIMARY KEY, event_id text NOT NULL)`
	if o.config.mysql {
		ddl = `CREATE TABLE ` + a.orders + ` (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL)`
	}
	_, err := db.Exec(ddl)
	require.NoError(t, err)
	return a
}

// placeOrders places n orders, one transaction each, and returns their
// event ids.
func (a *orderService) placeOrders(t testing.TB, kafkaTopic string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%d}`, i))
		ids[i] = msg.UUID
		tx, err := a.db.Begin()
		require.NoError(t, err)
		insert := `INSERT INTO ` + a.orders + ` (event_id) VALUES ($1)`
		if a.outbox.config.mysql {
			insert = `INSERT INTO ` + a.orders + ` (event_id) VALUES (?)`
		}
		_, err = tx.Exec(insert, msg.UUID)
		require.NoError(t, err)
		pub, err := a.outbox.publisher(tx)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(kafkaTopic, msg))
		require.NoError(t, tx.Commit())
	}
	return ids
}
