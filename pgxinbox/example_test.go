package pgxinbox_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The inbox on a pgx pool: BEGIN and the claim travel in one round trip.
// The handler writes its effect and, through watermill-sql v4, its
// follow-up event to an outbox, all in the inbox transaction. (Not run: it
// needs a PostgreSQL server.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := sqlinbox.NewPgx(pool, sqlinbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	mw, err := pgxinbox.NewMiddleware(pgxinbox.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	logger := watermill.NewStdLogger(false, false)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(middleware.Recoverer, mw)
	invoicing := func(msg *message.Message) error {
		tx, _ := pgxinbox.TxFromContext(msg.Context()) // a pgx.Tx
		if _, err := tx.Exec(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, msg.UUID); err != nil {
			return err
		}
		outbox, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, nil)
		if err != nil {
			return err
		}
		return outbox.Publish("invoices", message.NewMessage(watermill.NewUUID(), msg.Payload))
	}
	orders := gochannel.NewGoChannel(gochannel.Config{}, logger) // Kafka, AMQP...: any subscriber
	router.AddConsumerHandler("invoicing", "orders", orders, invoicing)
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
