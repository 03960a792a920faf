package docs_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// docs/wiring.md's first snippet: the two handler wrappers, and the
// router's middleware around them.
func TestWiringHandlers(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	p := newPipeline(t)
	router, sub, pub := p.router, p.pubSub, p.pubSub
	poisonQueue, err := middleware.PoisonQueue(pub, "orders_poison")
	require.NoError(t, err)
	retry := middleware.Retry{MaxRetries: 1, InitialInterval: time.Millisecond}
	var handled []string
	handleOrder := func(msg *message.Message) ([]*message.Message, error) {
		handled = append(handled, "billing")
		return nil, inboxTx(msg)
	}
	handleInvoice := func(msg *message.Message) error {
		handled = append(handled, "invoicing")
		return inboxTx(msg)
	}

	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Logger: router.Logger()})             // *sqlinbox.Store or *pgxinbox.Store
	router.AddHandler("billing", "orders", sub, "invoices", pub, inbox.Handler(mw, handleOrder))    // message.HandlerFunc
	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, handleInvoice)) // message.NoPublishHandlerFunc
	router.AddMiddleware(middleware.Recoverer, poisonQueue, retry.Middleware)                       // before or after: all outside

	require.NoError(t, err)
	p.deliver(t, "orders", "order-1", 2, 2, func() int { return countRows(t, db, "watermill_inbox")() })
}

// inboxTx takes the inbox transaction, as a handler that writes does.
func inboxTx(msg *message.Message) error {
	if _, ok := inbox.TxFromContext(msg.Context()); !ok {
		return inbox.ErrNotInInbox
	}
	return nil
}

// A handler's own outbox publisher on the inbox transaction, which
// docs/outbox.md mentions.
func publishInTx(msg *message.Message, logger watermill.LoggerAdapter) ([]*message.Message, error) {
	tx, ok := inbox.TxFromContext(msg.Context()) // *sql.Tx; pgxinbox.TxFromContext with a *pgxinbox.Store
	if !ok {
		return nil, inbox.ErrNotInInbox
	}
	pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, logger)
	if err != nil {
		return nil, err
	}
	return nil, pub.Publish("invoices", message.NewMessage(watermill.NewUUID(), []byte(`{}`)))
}

// The publisher writes its row in the claim's transaction.
func TestWiringPublisherOnTheInboxTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	require.NoError(t, createOutboxTable(ctx, db))
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	require.NoError(t, err)
	p := newPipeline(t)
	p.router.AddConsumerHandler("billing", "orders", p.pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		_, err := publishInTx(msg, watermill.NopLogger{})
		return err
	}))
	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, `"watermill_invoices"`))
}

// docs/wiring.md's inbox behind a watermill-sql subscriber: the handler of
// Watermill's exactly-once-delivery-counter example, unchanged.
func wireCounter(router *message.Router, sub message.Subscriber, mw message.HandlerMiddleware) {
	router.AddConsumerHandler("counter", "counter", sub, inbox.ConsumerHandler(mw, count)) // the one change
}

func count(msg *message.Message) error {
	tx, ok := wsql.TxFromContext(msg.Context()) // the inbox's transaction: inbox.TxFromContext returns it too
	if !ok {
		return inbox.ErrNotInInbox
	}
	_, err := tx.ExecContext(msg.Context(), `UPDATE counter SET value = value + 1`)
	return err
}

// Behind a watermill-sql subscriber, wsql.TxFromContext returns the claim's
// transaction: three copies of one event count once.
func TestWiringCounter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE counter (value INT NOT NULL); INSERT INTO counter VALUES (0)`)
	require.NoError(t, err)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	require.NoError(t, err)
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true, PollInterval: 10 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize("counter"))
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, watermill.NopLogger{})
	require.NoError(t, err)
	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set("event_id", "event-1")
		require.NoError(t, pub.Publish("counter", msg))
	}
	p := newPipeline(t)
	wireCounter(p.router, sub, mw)
	p.deliver(t, "unused", "", 0, 1, func() int {
		var n int
		require.NoError(t, db.QueryRow(`SELECT value FROM counter`).Scan(&n))
		return n
	})
}
