// Command nats-jetstream runs the inbox behind NATS JetStream and breaks the
// delivery on purpose, three ways JetStream redelivers:
//
//   - the producer publishes some orders twice, as one that retries after a
//     publish whose acknowledgement it never got;
//   - the handler takes longer than the consumer's AckWait for some orders,
//     so JetStream sends them again while the first copy is still in its
//     transaction (the copy waits for it, then finds the claim);
//   - the consumer fails some messages after its commit, as one that dies
//     before its ack, so JetStream sends them again.
//
// It prints what JetStream delivered and what the inbox skipped, and checks
// from the database that every order has exactly one invoice. (SQLite has
// one writer at a time: while a slow handler holds it, the messages behind
// it wait past AckWait too, and are redelivered as well.)
//
// With no flag it starts a NATS server with JetStream inside the process (the
// nats-server module) and keeps its data in a temporary directory, and the
// inbox in an embedded SQLite file: nothing to install.
//
//	go run ./_examples/nats-jetstream
//	go run ./_examples/nats-jetstream -url nats://127.0.0.1:4222   # a server of yours, JetStream enabled
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// ackWait is how long JetStream waits for an ack before it redelivers.
const ackWait = 500 * time.Millisecond

// invoicedKey marks, on one delivery, that the handler ran (the inbox did
// not skip it).
const invoicedKey = "example_invoiced"

func main() {
	url := flag.String("url", "", "NATS server URL, JetStream enabled (default: an embedded server)")
	orders := flag.Int("orders", 20, "orders to place")
	flag.Parse()
	if err := run(*url, *orders); err != nil {
		log.Fatal(err)
	}
}

func run(url string, orders int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "inbox-nats-jetstream")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if url == "" {
		ns, err := embeddedServer(filepath.Join(dir, "jetstream"))
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		url = ns.ClientURL()
	}

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

	// A stream of its own for this run, holding the subject of the same name
	// (watermill-nats publishes a topic to the subject named after it).
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	topic := "orders_" + strings.ToLower(watermill.NewShortUUID()[:8])
	if _, err := js.AddStream(&nats.StreamConfig{Name: topic, Subjects: []string{topic}}); err != nil {
		return fmt.Errorf("creating a stream (is JetStream enabled at %s?): %w", url, err)
	}
	defer func() { _ = js.DeleteStream(topic) }()

	jetStream := wmnats.JetStreamConfig{
		// One durable consumer (and queue group) for every instance of the
		// service. TrackMsgId stays off here so that the duplicates the
		// producer publishes reach the inbox; turned on, JetStream drops a
		// republished message within its duplicate window (two minutes by
		// default), a first line of defence before the inbox.
		DurablePrefix: "invoicing",
		SubscribeOptions: []nats.SubOpt{
			nats.DeliverAll(), nats.AckExplicit(), nats.AckWait(ackWait),
			// Without ManualAck, nats.go acks each message when
			// watermill-nats's callback returns, which it also does when its
			// own AckWaitTimeout expires or the subscriber closes while the
			// handler still runs: a message whose transaction then rolls
			// back would be lost.
			nats.ManualAck(),
		},
	}
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{URL: url, JetStream: jetStream}, nil)
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: "invoicing",
		SubscribersCount: 4,
		// watermill-nats's own wait for the handler: above the slowest
		// handler, or it gives up on the message (see ManualAck).
		AckWaitTimeout: 30 * time.Second,
		JetStream:      jetStream,
	}, nil)
	if err != nil {
		return err
	}
	defer sub.Close()

	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, nil)
	if err != nil {
		return err
	}
	var deliveries, calls, crashes atomic.Int64
	countDeliveries := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			deliveries.Add(1)
			return h(msg)
		}
	}
	// Outside the inbox: once the invoice of every 7th order committed,
	// fail as a consumer dying before its ack would.
	crashAfterCommit := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && msg.Metadata.Get(invoicedKey) != "" && orderNumber(msg)%7 == 6 {
				crashes.Add(1)
				return nil, errors.New("crashed after the commit, before the ack")
			}
			return out, err
		}
	}
	router.AddMiddleware(middleware.Recoverer, countDeliveries, crashAfterCommit, mw)

	var slowMu sync.Mutex
	slowed := map[string]bool{}
	router.AddConsumerHandler("invoicing", topic, sub, func(msg *message.Message) error {
		calls.Add(1)
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		if _, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES (?)`, msg.UUID); err != nil {
			return err
		}
		msg.Metadata.Set(invoicedKey, "yes") // for crashAfterCommit
		// Every 5th order is slower than AckWait the first time.
		slowMu.Lock()
		slow := orderNumber(msg)%5 == 4 && !slowed[msg.UUID]
		slowed[msg.UUID] = true
		slowMu.Unlock()
		if slow {
			time.Sleep(3 * ackWait)
		}
		return nil
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	published := 0
	for i := range orders {
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%d}`, i))
		copies := 1
		if i%4 == 3 {
			copies = 2 // the producer retried
		}
		for range copies {
			if err := pub.Publish(topic, msg); err != nil {
				return err
			}
			published++
		}
	}

	// Done when every order has its invoice and the consumer has nothing
	// left to deliver or to be acked.
	for {
		var invoices int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM invoices`).Scan(&invoices); err != nil {
			return err
		}
		info, err := js.ConsumerInfo(topic, "invoicing")
		if err != nil {
			return err
		}
		if invoices >= orders && info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the consumer to drain: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
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
	fmt.Printf("%d orders, %d messages published (%d published twice by the producer)\n", orders, published, published-orders)
	fmt.Printf("  JetStream deliveries   %2d  (redelivered after AckWait or a failure after the commit: %d)\n", deliveries.Load(), deliveries.Load()-int64(published))
	fmt.Printf("  handler calls          %2d\n", calls.Load())
	fmt.Printf("  duplicates skipped     %2d  acked without calling the handler\n", deliveries.Load()-calls.Load())
	fmt.Printf("  failed after commit    %2d  redelivered, then skipped\n", crashes.Load())
	fmt.Printf("from the database:\n")
	fmt.Printf("  inbox rows             %2d  one per (consumer, event)\n", claims)
	fmt.Printf("  invoices               %2d  for %d distinct orders\n", invoices, distinct)
	if invoices != orders || distinct != orders || claims != orders {
		return fmt.Errorf("expected exactly one invoice and one inbox row per order (%d), got %d invoices for %d orders and %d inbox rows", orders, invoices, distinct, claims)
	}
	if deliveries.Load() <= int64(published) {
		return errors.New("JetStream redelivered nothing: the example did not break the delivery")
	}
	fmt.Println("every order has exactly one invoice.")
	return nil
}

// embeddedServer starts a NATS server with JetStream in this process, on a
// free loopback port, storing in dir.
func embeddedServer(dir string) (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("the embedded NATS server did not start")
	}
	return ns, nil
}

// orderNumber reads the order number from the payload.
func orderNumber(msg *message.Message) int {
	var n int
	_, _ = fmt.Sscanf(string(msg.Payload), `{"order":%d}`, &n)
	return n
}
