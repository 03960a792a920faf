package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Ten deliveries of eight events, read from a subscriber in batches: each
// batch is claimed by one statement and written in one transaction, and
// every event is invoiced once.
func ExampleBatchConsumer() {
	dir, _ := os.MkdirTemp("", "inbox-batch")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", sqlinbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	_, _ = db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`)

	var committed atomic.Int64
	consumer, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: store, Consumer: "invoicing", MaxSize: 100},
		func(ctx context.Context, msgs []*message.Message) error {
			tx, _ := inbox.TxFromContext(ctx)
			for _, msg := range msgs {
				if _, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id) VALUES (?)`, msg.Metadata.Get("event_id")); err != nil {
					return err
				}
			}
			// Only to end the example once every event committed.
			return inbox.AfterCommit(ctx, func(context.Context) error {
				if committed.Add(int64(len(msgs))) == 8 {
					stop()
				}
				return nil
			})
		})
	if err != nil {
		log.Fatal(err)
	}

	// Persistent: the consumer may subscribe after the first publish.
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	done := make(chan error)
	go func() { done <- consumer.Run(ctx, pubSub, "orders") }()
	for _, id := range []string{"1", "2", "3", "2", "4", "5", "6", "7", "3", "8"} {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("event_id", "order-"+id)
		_ = pubSub.Publish("orders", msg)
	}
	<-done

	var invoices int
	_ = db.QueryRow(`SELECT COUNT(*) FROM invoices`).Scan(&invoices)
	fmt.Println("invoices:", invoices)
	// Output:
	// invoices: 8
}
