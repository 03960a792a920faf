// Command quickstart shows the inbox with nothing to install: an embedded
// SQLite file and Watermill's in-memory broker. Every order event is
// delivered three times and one handler call fails, yet each order gets
// exactly one invoice.
//
//	go run ./_examples/quickstart
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "inbox-quickstart")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	// SQLiteDSN sets what concurrent writers need: busy timeout, WAL, and
	// BEGIN IMMEDIATE.
	db, err := sql.Open("sqlite", sqlinbox.SQLiteDSN(filepath.Join(dir, "shop.db")))
	if err != nil {
		return err
	}
	defer db.Close()

	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	if err != nil {
		return err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE invoices (order_id TEXT NOT NULL)`); err != nil {
		return err
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		return err
	}

	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var deliveries, calls, failed atomic.Int64
	countDeliveries := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			deliveries.Add(1)
			return h(msg)
		}
	}
	// inbox.ConsumerHandler wraps the handler function itself, so the inbox
	// is the innermost layer: Recoverer, and anything that retries, wrap it
	// from outside whatever the order of the calls, and each attempt gets
	// its own transaction.
	router.AddMiddleware(middleware.Recoverer, countDeliveries)

	var failedOnce atomic.Bool
	router.AddConsumerHandler("invoicing", "orders", pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		calls.Add(1)
		// The inbox row and this insert commit together, or not at all.
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		orderID := msg.Metadata.Get("event_id")
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES (?)`, orderID); err != nil {
			return err
		}
		if orderID == "order-3" && failedOnce.CompareAndSwap(false, true) {
			failed.Add(1)
			return errors.New("payment service timed out") // the invoice above rolls back
		}
		return nil
	}))
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	const orders, copies = 5, 3
	for range copies {
		for i := 1; i <= orders; i++ {
			// A fresh envelope for every copy, as a relay retry builds it;
			// the producer's event_id is what stays the same.
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			msg.Metadata.Set("event_id", fmt.Sprintf("order-%d", i))
			if err := pubSub.Publish("orders", msg); err != nil { // returns once acked
				return err
			}
		}
	}
	if err := router.Close(); err != nil {
		return err
	}

	var invoices, distinct, claims int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT order_id) FROM invoices`).Scan(&invoices, &distinct); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+store.Table()).Scan(&claims); err != nil {
		return err
	}
	committed := calls.Load() - failed.Load()
	fmt.Printf("%d orders published %d times each: %d deliveries (%d redelivered after a failure)\n",
		orders, copies, deliveries.Load(), deliveries.Load()-orders*copies)
	fmt.Printf("  handler calls          %2d\n", calls.Load())
	fmt.Printf("  duplicates skipped     %2d  acked without calling the handler\n", deliveries.Load()-calls.Load())
	fmt.Printf("  failed and rolled back %2d  its invoice vanished with it; redelivered, then processed\n", failed.Load())
	fmt.Printf("  committed              %2d\n", committed)
	fmt.Printf("from the database:\n")
	fmt.Printf("  inbox rows             %2d  one per (consumer, event)\n", claims)
	fmt.Printf("  invoices               %2d  for %d distinct orders\n", invoices, distinct)
	if invoices != orders || distinct != orders || claims != orders || committed != int64(orders) {
		return fmt.Errorf("expected exactly one invoice and one inbox row per order (%d), got %d invoices for %d orders and %d inbox rows", orders, invoices, distinct, claims)
	}
	fmt.Println("every order has exactly one invoice.")
	return nil
}
