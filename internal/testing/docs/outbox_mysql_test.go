package docs_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"

	wsqlv3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql" // the rest of a v3 service
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// docs/outbox.md on MySQL: the invoice event of an order delivered three
// times is written once, through the queue schema, and the queue relay
// reads it, and also a row that watermill-sql v3's publisher wrote.
func TestOutboxMySQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("mysql", mysqlDatabaseDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	var (
		relay message.Subscriber
		mw    message.HandlerMiddleware
	)
	require.NoError(t, mysqlOutbox(db, store, watermill.NopLogger{}, &relay, &mw))

	p := newPipeline(t)
	p.router.AddHandler("billing", "orders", p.pubSub, "invoices", p.pubSub, inbox.Handler(mw, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte(`{"invoice":1}`))}, nil
	}))
	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, "watermill_invoices"))

	v3, err := wsqlv3.NewPublisher(db, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultMySQLSchema{}}, nil)
	require.NoError(t, err)
	require.NoError(t, v3.Publish("invoices", message.NewMessage(watermill.NewUUID(), []byte(`{"invoice":2}`))))

	broker := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = broker.Close() })
	relayed, err := broker.Subscribe(ctx, "invoices")
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runMySQLRelay(runCtx, relay, broker, watermill.NopLogger{}) }()
	for range 2 {
		select {
		case msg := <-relayed:
			msg.Ack()
		case <-time.After(20 * time.Second):
			t.Fatal("the relay published no row")
		}
	}
	require.Eventually(t, func() bool { return countRows(t, db, "watermill_invoices")() == 0 }, 20*time.Second, 20*time.Millisecond,
		"the relay deletes the rows it publishes")
	stop()
	require.NoError(t, <-done)
}

// mysqlOutbox is docs/outbox.md's MySQL snippet: the queue relay's
// subscriber, which creates the outbox table, and the middleware whose
// produced publisher writes to it.
func mysqlOutbox(db *sql.DB, store *sqlinbox.Store, logger watermill.LoggerAdapter, relay *message.Subscriber, middleware *message.HandlerMiddleware) error {
	noDeadline := time.Duration(0) // no AckDeadline: a slow publish stays in flight
	relaySubscriber, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: 100}, // payload column JSON; else GeneratePayloadType, on both sides
		OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		AckDeadline:    &noDeadline,
	}, logger)
	if err != nil {
		return err
	}
	if err := relaySubscriber.SubscribeInitialize("invoices"); err != nil { // creates watermill_invoices
		return err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store,
		ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) {
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}}, logger)
		}),
	})
	*relay, *middleware = relaySubscriber, mw
	return err
}

// runMySQLRelay is docs/outbox.md's relay loop: every replica runs it.
func runMySQLRelay(ctx context.Context, relaySubscriber message.Subscriber, brokerPublisher message.Publisher, logger watermill.LoggerAdapter) error {
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		return err
	}
	// RelaySubscriber: a stop mid-batch (ctx, router.Close, SIGTERM) rolls the batch back
	router.AddHandler("relay", "invoices", inbox.RelaySubscriber(relaySubscriber), "invoices", brokerPublisher, message.PassthroughHandler)
	return router.Run(ctx)
}

// mysqlDatabaseDSN creates a MySQL database of the test's own and returns
// a DSN whose connections work in it, so that a snippet's fixed table names
// do not meet another test's.
func mysqlDatabaseDSN(t *testing.T) string {
	t.Helper()
	admin := testdb.MySQL(t)
	name := testdb.Name("docs")
	_, err := admin.Exec("CREATE DATABASE " + name)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name) })
	c, err := mysql.ParseDSN(testdb.MySQLDSN())
	require.NoError(t, err)
	c.DBName = name
	return c.FormatDSN()
}
