// Command outbox-kafka-inbox runs the complete loop and breaks it on purpose:
//
//	orders service:   order row + event in its outbox, one transaction
//	relay:            outbox -> Kafka "orders"; crashes after publishing some rows, publishes them again
//	billing service:  inbox + invoice row + invoice event in its own outbox, one transaction;
//	                  crashes after some commits, before the ack, so Kafka redelivers
//	relay:            outbox -> Kafka "invoices", crashing the same way
//	notifier service: inbox + notification row
//
// then replays the orders topic from the oldest offset, as an operator would.
// It prints what was published and delivered, how many duplicates the inboxes
// skipped, and checks that every order has exactly one invoice and one
// notification.
//
//	go run ./_examples/outbox-kafka-inbox                      # embedded Kafka (kfake), local PostgreSQL
//	go run ./_examples/outbox-kafka-inbox -dsn 'root@tcp(127.0.0.1:3306)/test'   # MySQL, MariaDB
//	go run ./_examples/outbox-kafka-inbox -brokers localhost:9092 -dsn 'postgres://...'
//
// On MySQL and MariaDB the outboxes are watermill-sql's queue schema and its
// relay reads one row per batch: the default MySQL schema's relay skips rows
// that commit out of order (docs/outbox.md).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kfake"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

var nop = watermill.NopLogger{}

func main() {
	brokers := flag.String("brokers", "", "Kafka brokers, comma-separated (default: an embedded broker)")
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "a PostgreSQL URL, or a MySQL DSN (user@tcp(host:port)/db)")
	orders := flag.Int("orders", 20, "orders to place")
	flag.Parse()
	if err := run(*brokers, *dsn, *orders); err != nil {
		log.Fatal(err)
	}
}

func run(brokerList, dsn string, orders int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	addrs := strings.Split(brokerList, ",")
	if brokerList == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return err
		}
		defer cluster.Close()
		addrs = cluster.ListenAddrs()
	}
	d := databaseOf(dsn)
	db, err := sql.Open(d.driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()

	// Fresh names each run, so the counts are this run's.
	run := strings.ToLower(watermill.NewShortUUID()[:8])
	ordersTopic, invoicesTopic := "orders_"+run, "invoices_"+run
	if err := createTopics(addrs, ordersTopic, invoicesTopic); err != nil {
		return err
	}
	t := tables{db: db, d: d, run: run}
	defer t.drop()
	if err := t.create(ctx); err != nil {
		return err
	}

	// Billing: the invoice and the invoice event commit with the inbox claim.
	billing, err := newConsumer(db, d, t.name("inbox"), 7)
	if err != nil {
		return err
	}
	billingRouter, err := billing.router("billing", addrs, ordersTopic, invoicesTopic, "billing",
		outboxPublisher(d, t.name("outbox_billing")),
		func(ctx context.Context, tx *sql.Tx, msg *message.Message) ([]*message.Message, error) {
			orderID, _, _ := inbox.EventIDFromContext(ctx)
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+t.name("invoices")+` (order_event_id) VALUES (`+d.arg+`)`, orderID); err != nil {
				return nil, err
			}
			// A new event, with its own id; the order's id travels under
			// another key (copying "event_id" would make the next inbox
			// take the invoice for the order).
			invoice := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order_event_id":%q}`, orderID))
			invoice.Metadata.Set("order_event_id", orderID)
			return []*message.Message{invoice}, nil
		})
	if err != nil {
		return err
	}
	notifier, err := newConsumer(db, d, t.name("inbox"), 6)
	if err != nil {
		return err
	}
	notifierRouter, err := notifier.router("notifier", addrs, invoicesTopic, "", "notifier", nil,
		func(ctx context.Context, tx *sql.Tx, msg *message.Message) ([]*message.Message, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO `+t.name("notifications")+` (order_event_id) VALUES (`+d.arg+`)`, msg.Metadata.Get("order_event_id"))
			return nil, err
		})
	if err != nil {
		return err
	}
	relayOrders, err := newRelay(db, d, t.name("outbox_orders"), addrs, 5)
	if err != nil {
		return err
	}
	relayInvoices, err := newRelay(db, d, t.name("outbox_billing"), addrs, 6)
	if err != nil {
		return err
	}
	stop := start(ctx, billingRouter, notifierRouter, relayOrders.router, relayInvoices.router)
	defer stop()

	// The orders service: order row and event, one transaction each.
	for i := range orders {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%d}`, i))
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+t.name("orders")+` (event_id) VALUES (`+d.arg+`)`, msg.UUID); err != nil {
			_ = tx.Rollback()
			return err
		}
		pub, err := outboxPublisherIn(tx, d, t.name("outbox_orders"))
		if err == nil {
			err = pub.Publish(ordersTopic, msg)
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}

	if err := waitDrained(ctx, addrs, "notifier", invoicesTopic, func() bool {
		return relayOrders.done(orders) && relayInvoices.done(orders)
	}); err != nil {
		return err
	}
	if err := waitDrained(ctx, addrs, "billing", ordersTopic, nil); err != nil {
		return err
	}
	line("orders placed:", "%d (order row + event in the outbox, one transaction each)", orders)
	relayOrders.report("relay -> Kafka orders:")
	billing.report("billing:")
	relayInvoices.report("relay -> Kafka invoices:")
	notifier.report("notifier:")

	// An operator replays the orders from the oldest offset with a new
	// consumer group; the handler name, hence the inbox consumer, is the same.
	replay, err := newConsumer(db, d, t.name("inbox"), 0)
	if err != nil {
		return err
	}
	replayRouter, err := replay.router("billing", addrs, ordersTopic, invoicesTopic, "billing-replay",
		outboxPublisher(d, t.name("outbox_billing")),
		func(ctx context.Context, tx *sql.Tx, msg *message.Message) ([]*message.Message, error) {
			return nil, errors.New("a replayed order reached the handler")
		})
	if err != nil {
		return err
	}
	stopReplay := start(ctx, replayRouter)
	if err := waitDrained(ctx, addrs, "billing-replay", ordersTopic, nil); err != nil {
		return err
	}
	stopReplay()
	replay.report("replay of orders:")

	return t.check(ctx, orders)
}

// outboxPublisher returns the inbox's ProducedPublisher: it writes to the
// outbox in the transaction of the message's claim. The forwarder
// envelope records the destination topic; the relay unwraps it and keeps
// the message UUID. AutoInitializeSchema stays false: watermill-sql refuses
// it in a transaction.
func outboxPublisher(d database, outboxTopic string) func(tx *sql.Tx) (message.Publisher, error) {
	return func(tx *sql.Tx) (message.Publisher, error) {
		return outboxPublisherIn(tx, d, outboxTopic)
	}
}

// outboxPublisherIn writes to the outbox in tx.
func outboxPublisherIn(tx *sql.Tx, d database, outboxTopic string) (message.Publisher, error) {
	pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: d.relay.SchemaAdapter}, nop)
	if err != nil {
		return nil, err
	}
	return forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: outboxTopic}), nil
}

// consumer counts what reaches its inbox and what its handler commits.
type consumer struct {
	store            *sqlinbox.Store
	crashEvery       int64
	delivered, calls atomic.Int64
	crashes          atomic.Int64
}

func newConsumer(db *sql.DB, d database, inboxTable string, crashEvery int64) (*consumer, error) {
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: d.dialect, Table: inboxTable})
	return &consumer{store: store, crashEvery: crashEvery}, err
}

type handlerFunc func(ctx context.Context, tx *sql.Tx, msg *message.Message) ([]*message.Message, error)

func (c *consumer) router(name string, addrs []string, topic, publishTopic, group string,
	producedPublisher func(tx *sql.Tx) (message.Publisher, error), h handlerFunc,
) (*message.Router, error) {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               addrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: consumerConfig(),
		ConsumerGroup:         group,
	}, nop)
	if err != nil {
		return nil, err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: c.store, ProducedPublisher: inbox.PublishInTx(producedPublisher)})
	if err != nil {
		return nil, err
	}
	r, err := message.NewRouter(message.RouterConfig{}, nop)
	if err != nil {
		return nil, err
	}
	var handled atomic.Int64
	var mu sync.Mutex
	crashed := map[string]bool{}
	// Outside the inbox: counts deliveries, and after some commits fails
	// the way a process killed before its ack would.
	crashAfterCommit := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			c.delivered.Add(1)
			out, err := next(msg)
			if err != nil || c.crashEvery == 0 {
				return out, err
			}
			mu.Lock()
			defer mu.Unlock()
			if !crashed[msg.UUID] && handled.Add(1)%c.crashEvery == 0 {
				crashed[msg.UUID] = true
				c.crashes.Add(1)
				return nil, errors.New("crashed after the commit, before the ack")
			}
			crashed[msg.UUID] = true
			return out, nil
		}
	}
	r.AddMiddleware(middleware.Recoverer, crashAfterCommit, mw)
	r.AddHandler(name, topic, sub, publishTopic, noPublisher{}, func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return nil, inbox.ErrNotInInbox
		}
		c.calls.Add(1)
		return h(ctx, tx, msg)
	})
	return r, nil
}

func (c *consumer) report(label string) {
	line(label, "%d delivered, %d crashes after commit, %d duplicates skipped, %d handled",
		c.delivered.Load(), c.crashes.Load(), c.delivered.Load()-c.calls.Load(), c.calls.Load())
}

func line(label, format string, args ...any) {
	fmt.Printf("%-25s %s\n", label, fmt.Sprintf(format, args...))
}

// noPublisher stands where the router would publish produced messages: the
// inbox publishes them in its transaction instead, so none reach it.
type noPublisher struct{}

func (noPublisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) > 0 {
		return fmt.Errorf("%d messages reached the router's publisher", len(msgs))
	}
	return nil
}
func (noPublisher) Close() error { return nil }

// relay forwards an outbox to Kafka and crashes after publishing every
// crashEvery-th row: the outbox subscriber delivers that row again.
type relay struct {
	router                   *message.Router
	rows, published, crashes atomic.Int64 // rows: distinct rows published
	republished              atomic.Int64
}

func newRelay(db *sql.DB, d database, outboxTopic string, addrs []string, crashEvery int64) (*relay, error) {
	config := d.relay
	config.PollInterval, config.ResendInterval = 20*time.Millisecond, 20*time.Millisecond
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), config, nop)
	if err != nil {
		return nil, err
	}
	// The relay owns the outbox tables: producers publish in transactions,
	// where watermill-sql cannot create them.
	if err := sub.SubscribeInitialize(outboxTopic); err != nil {
		return nil, err
	}
	pubConfig := kafka.DefaultSaramaSyncPublisherConfig()
	pubConfig.Metadata.Retry.Backoff = 100 * time.Millisecond
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: pubConfig}, nop)
	if err != nil {
		return nil, err
	}
	r := &relay{}
	var mu sync.Mutex
	crashed := map[string]bool{}
	crash := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err != nil {
				return out, err
			}
			r.published.Add(1)
			mu.Lock()
			defer mu.Unlock()
			if again, seen := crashed[msg.UUID]; seen {
				// The outbox may deliver a row again without a crash (a
				// failed ack); only a crashed row's retry counts as one.
				if again {
					r.republished.Add(1)
				}
				return out, nil
			}
			crashed[msg.UUID] = false
			if r.rows.Add(1)%crashEvery == 0 {
				crashed[msg.UUID] = true
				r.crashes.Add(1)
				return nil, errors.New("relay crashed after publishing, before acking the row")
			}
			return out, nil
		}
	}
	r.router, err = message.NewRouter(message.RouterConfig{}, nop)
	if err != nil {
		return nil, err
	}
	_, err = forwarder.NewForwarder(sub, pub, nop, forwarder.Config{
		ForwarderTopic: outboxTopic, Router: r.router, Middlewares: []message.HandlerMiddleware{crash},
	})
	return r, err
}

func (r *relay) report(label string) {
	line(label, "%d published, %d of them again after a relay crash", r.published.Load(), r.crashes.Load())
}

func (r *relay) done(rows int) bool {
	return r.rows.Load() == int64(rows) && r.republished.Load() >= r.crashes.Load()
}

// start runs routers until the returned function is called.
func start(ctx context.Context, routers ...*message.Router) (stop func()) {
	for _, r := range routers {
		go func() { _ = r.Run(ctx) }()
		<-r.Running()
	}
	return func() {
		for _, r := range routers {
			_ = r.Close()
		}
	}
}

func consumerConfig() *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// Otherwise each synchronous offset commit waits behind the fetch
	// long-poll (500ms by default).
	c.Consumer.MaxWaitTime = 50 * time.Millisecond
	c.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	return c
}

func createTopics(addrs []string, topics ...string) error {
	admin, err := sarama.NewClusterAdmin(addrs, sarama.NewConfig())
	if err != nil {
		return fmt.Errorf("connecting to Kafka at %v: %w", addrs, err)
	}
	defer admin.Close()
	for _, topic := range topics {
		if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1}, false); err != nil {
			return fmt.Errorf("creating topic %s: %w", topic, err)
		}
	}
	return nil
}

// waitDrained waits until group has committed every record of topic and
// ready (if set) is true.
func waitDrained(ctx context.Context, addrs []string, group, topic string, ready func() bool) error {
	client, err := sarama.NewClient(addrs, sarama.NewConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return err
	}
	partitions, err := client.Partitions(topic)
	if err != nil {
		return err
	}
	for {
		drained := ready == nil || ready()
		if drained {
			offsets, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: partitions})
			switch {
			case errors.Is(err, sarama.ErrGroupIDNotFound): // not joined yet
				drained = false
			case err != nil:
				return err
			}
			for _, p := range partitions {
				if !drained {
					break
				}
				newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err != nil {
					return err
				}
				// A partition that never received a record has nothing to
				// consume, and the group never commits an offset for it.
				if b := offsets.GetBlock(topic, p); newest > 0 && (b == nil || b.Offset != newest) {
					drained = false
				}
			}
		}
		if drained {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for group %s to consume %s: %w", group, topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// database is what differs between PostgreSQL and MySQL/MariaDB.
type database struct {
	driver  string
	dialect sqlinbox.Dialect
	arg     string // the first placeholder
	key     string // an auto-increment primary key column
	quote   func(name string) string
	// relay is the outbox relay's subscriber configuration; its schema
	// adapter is also the publishers'.
	relay wsql.SubscriberConfig
}

var (
	postgres = database{
		driver: "pgx", dialect: sqlinbox.PostgreSQL, arg: "$1", key: "id bigserial PRIMARY KEY",
		quote: func(name string) string { return `"` + name + `"` },
		relay: wsql.SubscriberConfig{
			ConsumerGroup:  "relay",
			SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
			OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		},
	}
	// mysql's outboxes are queues: the relay deletes each row it
	// published and reads every row left, one per batch, with no consumer
	// group (docs/outbox.md).
	mysql = database{
		driver: "mysql", dialect: sqlinbox.MySQL, arg: "?", key: "id BIGINT AUTO_INCREMENT PRIMARY KEY",
		quote: func(name string) string { return "`" + name + "`" },
		relay: wsql.SubscriberConfig{
			SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: 1},
			OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		},
	}
)

// databaseOf tells PostgreSQL URLs from MySQL DSNs.
func databaseOf(dsn string) database {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return postgres
	}
	return mysql
}

// tables are this run's business, inbox and outbox tables.
type tables struct {
	db  *sql.DB
	d   database
	run string
}

func (t tables) name(what string) string { return "example_" + what + "_" + t.run }

func (t tables) create(ctx context.Context) error {
	for _, table := range []string{"orders", "invoices", "notifications"} {
		column := "order_event_id"
		if table == "orders" {
			column = "event_id"
		}
		// No unique key: a duplicate effect would show as a second row.
		if _, err := t.db.ExecContext(ctx, `CREATE TABLE `+t.name(table)+` (`+t.d.key+`, `+column+` VARCHAR(64) NOT NULL)`); err != nil {
			return err
		}
	}
	store, err := sqlinbox.New(t.db, sqlinbox.Config{Dialect: t.d.dialect, Table: t.name("inbox")})
	if err != nil {
		return err
	}
	return store.CreateSchema(ctx)
}

func (t tables) drop() {
	names := []string{t.name("orders"), t.name("invoices"), t.name("notifications"), t.name("inbox")}
	for _, outbox := range []string{"outbox_orders", "outbox_billing"} {
		names = append(names, t.d.quote("watermill_"+t.name(outbox)), t.d.quote("watermill_offsets_"+t.name(outbox)))
	}
	_, _ = t.db.Exec(`DROP TABLE IF EXISTS ` + strings.Join(names, ", "))
}

// check verifies the guarantee: one invoice and one notification per order.
func (t tables) check(ctx context.Context, orders int) error {
	var invoices, notifications, bad int
	err := t.db.QueryRowContext(ctx, `
		SELECT (SELECT count(*) FROM `+t.name("invoices")+`),
		       (SELECT count(*) FROM `+t.name("notifications")+`),
		       (SELECT count(*) FROM `+t.name("orders")+` o WHERE
		            (SELECT count(*) FROM `+t.name("invoices")+` i WHERE i.order_event_id = o.event_id) <> 1 OR
		            (SELECT count(*) FROM `+t.name("notifications")+` n WHERE n.order_event_id = o.event_id) <> 1)`,
	).Scan(&invoices, &notifications, &bad)
	if err != nil {
		return err
	}
	line("effects written:", "%d invoices, %d notifications for %d orders", invoices, notifications, orders)
	if bad > 0 {
		return fmt.Errorf("%d orders do not have exactly one invoice and one notification", bad)
	}
	line("checked:", "every order has exactly one invoice and one notification")
	return nil
}
