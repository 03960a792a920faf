package docs_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/riverqueue/river"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// docs/outbox.md: the messages a handler returns commit to its outbox with
// the claim; three copies of an order make one invoice and one outbox row.
func TestOutboxProducedPublisher(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	require.NoError(t, createOutboxTable(ctx, db))
	p := newPipeline(t)
	router, kafkaSubscriber, kafkaPublisher := p.router, p.pubSub, p.pubSub
	logger, orderID, invoiceJSON := watermill.NopLogger{}, "order-1", []byte(`{"order_id":"order-1"}`)

	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store,
		ProducedPublisher: inbox.PublishInTx(func(tx *sql.Tx) (message.Publisher, error) { // the claim's transaction
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{
				SchemaAdapter: wsql.DefaultPostgreSQLSchema{}, // AutoInitializeSchema must stay false
			}, logger)
		}),
	})
	router.AddHandler("billing", "orders", kafkaSubscriber, "invoices", kafkaPublisher, inbox.Handler(mw, func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return nil, inbox.ErrNotInInbox
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, orderID); err != nil {
			return nil, err
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), invoiceJSON)}, nil // to B's outbox, topic "invoices"
	}))

	require.NoError(t, err)
	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, `"watermill_invoices"`))
	require.Equal(t, 1, countRows(t, db, "invoices")())
}

// createOutboxTable is docs/outbox.md's start-up step: the outbox table of
// topic "invoices", from the publisher's schema adapter.
func createOutboxTable(ctx context.Context, db *sql.DB) error {
	queries, err := wsql.DefaultPostgreSQLSchema{}.SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: "invoices"})
	for _, q := range queries {
		if _, err := db.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return err
		}
	}
	return err
}

// SendInvoiceEmail is the job of docs/outbox.md's River snippet.
type SendInvoiceEmail struct {
	EventID string `json:"event_id"`
}

func (SendInvoiceEmail) Kind() string { return "send_invoice_email" }

// wireInvoicing is docs/outbox.md's handler that inserts a River job in the
// inbox transaction. internal/testing/jobqueue runs the same under kills.
func wireInvoicing(router *message.Router, sub message.Subscriber, mw message.HandlerMiddleware, riverClient *river.Client[*sql.Tx], orderID string) {
	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		ctx := msg.Context()
		tx, ok := inbox.TxFromContext(ctx)
		if !ok {
			return inbox.ErrNotInInbox
		}
		eventID, _, _ := inbox.EventIDFromContext(ctx)
		if _, err := tx.ExecContext(ctx, `INSERT INTO invoices (event_id, order_id) VALUES ($1, $2)`, eventID, orderID); err != nil {
			return err
		}
		_, err := riverClient.InsertTx(ctx, tx, SendInvoiceEmail{EventID: eventID}, nil)
		return err // an error rolls back the claim, the invoice and the job
	}))
}

var _ = wireInvoicing
