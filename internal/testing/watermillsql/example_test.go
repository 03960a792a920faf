package watermillsql_test

import (
	"context"
	stdsql "database/sql"
	"fmt"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The produced messages go to a watermill-sql v4 outbox through the inbox
// transaction: wsql.TxFromStdSQL(tx), never wsql.BeginnerFromStdSQL(db),
// whose rows would commit on their own (the middleware refuses that one
// with inbox.ErrMiswired).
func Example_producedPublisher() {
	ctx := context.Background()
	db, err := stdsql.Open("pgx", testdb.PostgresDSN())
	check(err)
	defer db.Close()
	inboxTable, invoices := testdb.Name("inbox"), testdb.Name("invoices")
	schema := wsql.DefaultPostgreSQLSchema{}
	defer func() {
		_, _ = db.Exec(fmt.Sprintf(`DROP TABLE IF EXISTS %s, %s, "watermill_offsets_%s"`, inboxTable, schema.MessagesTable(invoices), invoices))
	}()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: inboxTable})
	check(err)
	check(store.CreateSchema(ctx))
	// The outbox table must exist before a transaction publishes to it.
	relay, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
	}, nil)
	check(err)
	check(relay.SubscribeInitialize(invoices))

	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store,
		ProducedPublisher: inbox.PublishInTx(func(tx *stdsql.Tx) (message.Publisher, error) { // the claim's transaction
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: schema}, nil)
		}),
	})
	check(err)
	check(effects.InvoiceTwice(ctx, mw, invoices)) // one order, delivered twice

	var rows int
	check(db.QueryRow(`SELECT count(*) FROM ` + schema.MessagesTable(invoices)).Scan(&rows))
	fmt.Println("outbox rows:", rows)
	// Output: outbox rows: 1
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}
