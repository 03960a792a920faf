// Command postgres shows the inbox on PostgreSQL: every order event arrives
// three times and the first attempt of one of them fails, yet each order gets
// exactly one invoice. It fails unless the counts come out exact.
//
//	go run ./_examples/postgres -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// Its tables are its own, named after -table (a fresh name each run by
// default) and dropped at the end unless -keep is given, so runs on a shared
// server never touch each other's tables.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"os"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/lib/pq"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func main() {
	dsn := flag.String("dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	table := flag.String("table", "", "the inbox table; the invoices go to TABLE_invoices (default: example_ and a random suffix)")
	keep := flag.Bool("keep", false, "keep both tables at the end, to look at them")
	flag.Parse()
	if err := run(os.Stdout, *dsn, *table, *keep); err != nil {
		log.Fatal(err)
	}
}

func run(out io.Writer, dsn, table string, keep bool) error {
	ctx := context.Background()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if table == "" {
		table = fmt.Sprintf("example_%08x", rand.Uint32())
	}
	invoicesTable := table + "_invoices"

	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	if err != nil {
		return err
	}
	if !keep {
		defer func() { _, _ = db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table+`, `+invoicesTable) }()
	}
	if err := store.CreateSchema(ctx); err != nil {
		return err
	}
	// A fresh start each run, so the counts below are this run's.
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+invoicesTable+`;
		CREATE TABLE `+invoicesTable+` (order_id text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
		TRUNCATE `+table); err != nil {
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
	// Recoverer outside the inbox (inbox.ConsumerHandler keeps it innermost):
	// a panic rolls back, then becomes a nack.
	router.AddMiddleware(middleware.Recoverer)

	var calls, failures atomic.Int64
	var failedOnce atomic.Bool
	router.AddConsumerHandler("invoicing", "orders", pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		calls.Add(1)
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		orderID := msg.Metadata.Get("event_id")
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO `+invoicesTable+` (order_id) VALUES ($1)`, orderID); err != nil {
			return err
		}
		if orderID == "order-3" && failedOnce.CompareAndSwap(false, true) {
			failures.Add(1)
			return errors.New("payment service timed out") // the invoice above rolls back
		}
		return nil
	}))
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	const orders, copies = 5, 3
	for c := 0; c < copies; c++ {
		for i := 1; i <= orders; i++ {
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			msg.Metadata.Set("event_id", fmt.Sprintf("order-%d", i))
			if err := pubSub.Publish("orders", msg); err != nil { // returns once acked
				return err
			}
		}
	}
	_ = router.Close()

	var invoices int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+invoicesTable).Scan(&invoices); err != nil {
		return err
	}
	fmt.Fprintf(out, "deliveries:        %d (%d orders x %d copies, plus 1 redelivery after a failure)\n", orders*copies+1, orders, copies)
	fmt.Fprintf(out, "handler calls:     %d (%d duplicates skipped without calling it)\n", calls.Load(), int64(orders*copies+1)-calls.Load())
	fmt.Fprintf(out, "failed, rolled back: %d (redelivered and processed again)\n", failures.Load())
	fmt.Fprintf(out, "invoices written:  %d (one per order)\n", invoices)
	if invoices != orders {
		return fmt.Errorf("%d invoices for %d orders", invoices, orders)
	}
	return nil
}
