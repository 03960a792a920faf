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
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/kafkatest"
	"github.com/watermill-inbox/inbox/internal/testdb"
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

// publishEvents publishes n new events straight to Kafka and returns their
// ids (msg.UUID).
func publishEvents(t testing.TB, pub message.Publisher, topic string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"n":%d}`, i))
		ids[i] = msg.UUID
		require.NoError(t, pub.Publish(topic, msg))
	}
	return ids
}

// service is a consumer with a non-idempotent effect: one row per handled
// message in a table without a unique key, so a duplicate effect shows up
// as a second row.
type service struct {
	name    string // handler name, hence inbox consumer
	db      *stdsql.DB
	store   *sqlinbox.Store
	inbox   string // inbox table
	effects string // effect table

	delivered atomic.Int64 // messages that reached the inbox
	handled   atomic.Int64 // handler calls that committed
}

// newService creates a service with its own inbox and effect tables.
func newService(t testing.TB, db *stdsql.DB, name string) *service {
	t.Helper()
	s := openService(t, db, name, testdb.Table(t, db, "inbox"), testdb.Table(t, db, "effects"))
	require.NoError(t, s.store.CreateSchema(context.Background()))
	_, err := db.Exec(`CREATE TABLE ` + s.effects + ` (id bigserial PRIMARY KEY, event_id text NOT NULL)`)
	require.NoError(t, err)
	return s
}

// openService uses tables another process created.
func openService(t testing.TB, db *stdsql.DB, name, inboxTable, effects string) *service {
	t.Helper()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: inboxTable})
	require.NoError(t, err)
	return &service{name: name, db: db, store: store, inbox: inboxTable, effects: effects}
}

// fixture is what every cause test starts with: PostgreSQL, a broker, a
// topic and the billing service that consumes it.
type fixture struct {
	db      *stdsql.DB
	broker  *broker
	topic   string
	billing *service
}

func setup(t testing.TB) fixture {
	t.Helper()
	db := testdb.Postgres(t, "pgx")
	b := newBroker(t)
	return fixture{db: db, broker: b, topic: b.topic(t, "orders"), billing: newService(t, db, "billing")}
}

// runConfig adds behaviour around a service's handler.
type runConfig struct {
	// outer wraps the inbox: it sees every delivery, and what it does after
	// the inner handler returns happens after the commit.
	outer message.HandlerMiddleware
	// produce makes the handler return follow-up events, published to
	// publishTopic through producedPublisher inside the transaction.
	produce           func(msg *message.Message) []*message.Message
	publishTopic      string
	producedPublisher func(tx *stdsql.Tx) (message.Publisher, error)
	// afterEffect runs in the handler after the effect is written.
	afterEffect func(msg *message.Message) error
	// effectKey is what the effect row records. Defaults to the event id.
	effectKey func(msg *message.Message) string
}

// run consumes topic with sub until the returned stop function is called
// (also at the end of the test).
func (s *service) run(t testing.TB, sub message.Subscriber, topic string, rc runConfig) (stop func()) {
	t.Helper()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	require.NoError(t, err)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: s.store, ProducedPublisher: rc.producedPublisher})
	require.NoError(t, err)

	h := router.AddHandler(s.name, topic, sub, rc.publishTopic, discardPublisher{}, s.handle(rc))
	var mws []message.HandlerMiddleware
	mws = append(mws, func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			s.delivered.Add(1)
			return h(msg)
		}
	})
	if rc.outer != nil {
		mws = append(mws, rc.outer)
	}
	mws = append(mws, mw)
	h.AddMiddleware(mws...)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("router %s stopped at start: %v", s.name, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

func (s *service) handle(rc runConfig) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return nil, errors.New("no inbox transaction")
		}
		key, _, _ := inbox.EventIDFromContext(ctx)
		if rc.effectKey != nil {
			key = rc.effectKey(msg)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.effects+` (event_id) VALUES ($1)`, key); err != nil {
			return nil, fmt.Errorf("writing the effect: %w", err)
		}
		if rc.afterEffect != nil {
			if err := rc.afterEffect(msg); err != nil {
				return nil, err
			}
		}
		var out []*message.Message
		if rc.produce != nil {
			out = rc.produce(msg)
		}
		// Counted once the commit happened, not before.
		if err := inbox.AfterCommit(ctx, func(context.Context) error { s.handled.Add(1); return nil }); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// effectCounts returns how many effect rows each event id has.
func (s *service) effectCounts(t testing.TB) map[string]int {
	t.Helper()
	rows, err := s.db.Query(`SELECT event_id, count(*) FROM ` + s.effects + ` GROUP BY event_id`)
	require.NoError(t, err)
	defer rows.Close()
	counts := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		counts[id] = n
	}
	require.NoError(t, rows.Err())
	return counts
}

// requireExactlyOnce asserts that every id has exactly one effect row and
// that no other effect exists.
func (s *service) requireExactlyOnce(t testing.TB, ids []string) {
	t.Helper()
	want := make(map[string]int, len(ids))
	for _, id := range ids {
		want[id] = 1
	}
	require.Equal(t, want, s.effectCounts(t), "%s: effects per event id", s.name)
}

func (s *service) effectRows(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, s.db.QueryRow(`SELECT count(*) FROM `+s.effects).Scan(&n))
	return n
}

// waitEffects waits until the service has written n effect rows.
func (s *service) waitEffects(t testing.TB, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return s.effectRows(t) >= n }, waitFor, 20*time.Millisecond,
		"%s wrote %d effects, want %d", s.name, s.effectRows(t), n)
}

// discardPublisher stands for the router's publisher when the inbox
// publishes produced messages itself: the router must never get any.
type discardPublisher struct{}

func (discardPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) > 0 {
		return fmt.Errorf("router asked to publish %d messages to %s after the commit", len(msgs), topic)
	}
	return nil
}

func (discardPublisher) Close() error { return nil }

// outbox is a watermill-sql v4 outbox on PostgreSQL, fronted by Watermill's
// forwarder: producers publish enveloped messages to one SQL topic in their
// own transaction, and the relay publishes each to the destination topic
// named in its envelope.
type outbox struct {
	db    *stdsql.DB
	topic string // the SQL topic; its table is watermill_<topic>
}

var (
	outboxSchema  = wsql.DefaultPostgreSQLSchema{}
	outboxOffsets = wsql.DefaultPostgreSQLOffsetsAdapter{}
)

// newOutbox creates the outbox tables up front: a publisher bound to a
// transaction must not create them itself (watermill-sql refuses
// AutoInitializeSchema with a transaction).
func newOutbox(t testing.TB, db *stdsql.DB) *outbox {
	t.Helper()
	o := &outbox{db: db, topic: testdb.Name("outbox")}
	t.Cleanup(func() {
		_, _ = db.Exec(`DROP TABLE IF EXISTS "watermill_` + o.topic + `", "watermill_offsets_` + o.topic + `"`)
	})
	sub := o.subscriber(t)
	require.NoError(t, sub.SubscribeInitialize(o.topic))
	return o
}

// publisher returns an outbox publisher bound to tx: what it publishes
// commits or rolls back with tx.
func (o *outbox) publisher(tx *stdsql.Tx) (message.Publisher, error) {
	pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: outboxSchema}, logger)
	if err != nil {
		return nil, err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: o.topic}), nil
}

func (o *outbox) subscriber(t testing.TB) *wsql.Subscriber {
	t.Helper()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(o.db), wsql.SubscriberConfig{
		ConsumerGroup:  "relay",
		PollInterval:   20 * time.Millisecond,
		ResendInterval: 20 * time.Millisecond,
		RetryInterval:  100 * time.Millisecond,
		SchemaAdapter:  outboxSchema,
		OffsetsAdapter: outboxOffsets,
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// relay is Watermill's forwarder from an outbox to Kafka. It can crash after
// publishing and before acking the outbox row, so the row is published again.
type relay struct {
	published   atomic.Int64 // publishes to Kafka, republishes included
	rows        atomic.Int64 // distinct outbox rows published
	crashes     atomic.Int64 // crashes injected after a publish
	republished atomic.Int64 // crashed rows published again
}

// startRelay runs a relay from o to Kafka that crashes after publishing
// every crashEvery-th row (0: never).
func startRelay(t testing.TB, o *outbox, addrs []string, crashEvery int) *relay {
	t.Helper()
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
	fwd, err := forwarder.NewForwarder(o.subscriber(t), kafkaPublisher(t, addrs), logger, forwarder.Config{
		ForwarderTopic: o.topic,
		Middlewares:    []message.HandlerMiddleware{crash},
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
	t.Cleanup(func() {
		_ = fwd.Close()
		<-done
	})
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
	_, err := db.Exec(`CREATE TABLE ` + a.orders + ` (id bigserial PRIMARY KEY, event_id text NOT NULL)`)
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
		_, err = tx.Exec(`INSERT INTO `+a.orders+` (event_id) VALUES ($1)`, msg.UUID)
		require.NoError(t, err)
		pub, err := a.outbox.publisher(tx)
		require.NoError(t, err)
		require.NoError(t, pub.Publish(kafkaTopic, msg))
		require.NoError(t, tx.Commit())
	}
	return ids
}

// crashAfterCommit returns a middleware for outside the inbox that fails
// the first delivery of every n-th message after the inbox committed it, as
// a consumer dying before its ack would: the broker redelivers a message
// whose effect is already committed.
func crashAfterCommit(n int64) (message.HandlerMiddleware, *atomic.Int64) {
	var (
		mu      sync.Mutex
		seen    = map[string]bool{}
		handled int64
		crashes atomic.Int64
	)
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[msg.UUID] {
				return out, nil
			}
			seen[msg.UUID] = true
			if handled++; handled%n == 0 {
				crashes.Add(1)
				return nil, errors.New("consumer crashed after its commit, before the ack")
			}
			return out, nil
		}
	}, &crashes
}
