package pgxinbox_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The inbox on a pgx pool: BEGIN and the claim travel in one round trip.
// The handler writes its effect in the inbox transaction; a follow-up event
// goes to an outbox in the same transaction through watermill-sql v4:
// wsql.NewPublisher(wsql.TxFromPgx(tx), ...). (Not run: it needs a
// PostgreSQL server.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	logger := watermill.NewStdLogger(false, false)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(middleware.Recoverer)
	invoicing := func(msg *message.Message) error {
		tx, ok := pgxinbox.TxFromContext(msg.Context()) // a pgx.Tx
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, msg.UUID)
		return err
	}
	orders := gochannel.NewGoChannel(gochannel.Config{}, logger) // Kafka, AMQP...: any subscriber
	router.AddConsumerHandler("invoicing", "orders", orders, inbox.ConsumerHandler(mw, invoicing))
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
