package inbox_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	inbox "github.com/watermill-inbox/inbox"
)

// The recommended middleware stack, outermost first: PoisonQueue, Retry,
// Recoverer, then the inbox around the handler function.
//
//   - PoisonQueue takes what is not transient: a database down or
//     restarting, a lost connection or a failed commit is nacked instead, and
//     the broker redelivers it until the database is back, however long
//     that takes. Poisoned, a live message would wait for a replay by hand.
//   - Retry retries in place with backoff, each attempt in a new
//     transaction, except what is permanent (no or a malformed event id, an
//     id reused, a refused wiring), which no attempt can fix: it goes to the
//     poison queue at once.
//   - Recoverer inside Retry turns a panic into an error that is retried,
//     then poisoned. Outermost, it would catch the panic past Retry and
//     PoisonQueue: the message would be nacked and redelivered forever (on
//     gochannel, thousands of times a second).
//   - The inbox innermost, by ConsumerHandler whatever the order of the
//     calls: a failed attempt rolls back its claim with its writes.
//
// Here order-1 arrives twice and is invoiced once; order-2's payment call
// times out five times, which outlasts Retry, and the redelivery invoices
// it; order-3 hits a bug; the last message's event id holds a NUL byte.
func Example_retriesAndPoisonQueue() {
	db, store, done := exampleStore()
	defer done()
	if _, err := db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}

	poisonQueue, err := middleware.PoisonQueueWithFilter(pubSub, "orders_poisoned", func(err error) bool {
		return !inbox.IsTransient(err)
	})
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(
		poisonQueue,
		middleware.Retry{
			MaxRetries:      3,
			InitialInterval: 100 * time.Millisecond,
			ShouldRetry:     func(p middleware.RetryParams) bool { return !inbox.IsPermanent(p.Err) },
		}.Middleware,
		middleware.Recoverer,
	)

	calls := map[string]int{}
	router.AddConsumerHandler("invoicing", "orders", pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		id, _, _ := inbox.EventIDFromContext(msg.Context())
		calls[id]++
		switch {
		case id == "order-2" && calls[id] <= 5:
			return fmt.Errorf("charging %s: %w", id, context.DeadlineExceeded)
		case id == "order-3":
			panic("assignment to entry in nil map")
		}
		tx, _ := inbox.TxFromContext(msg.Context())
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES (?)`, id)
		return err
	}))

	poisoned, err := pubSub.Subscribe(context.Background(), "orders_poisoned")
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var reasons []string
	go func() {
		for msg := range poisoned {
			reason, _, _ := strings.Cut(msg.Metadata.Get(middleware.ReasonForPoisonedKey), ", stacktrace")
			mu.Lock()
			reasons = append(reasons, fmt.Sprintf("poisoned %q: %s", msg.Metadata.Get("event_id"), reason))
			mu.Unlock()
			msg.Ack()
		}
	}()

	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()
	for _, id := range []string{"order-1", "order-1", "order-2", "order-3", "order-4\x00"} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set("event_id", id)
		if err := pubSub.Publish("orders", msg); err != nil { // returns once acked
			log.Fatal(err)
		}
	}
	if err := router.Close(); err != nil {
		log.Fatal(err)
	}

	var invoices int
	_ = db.QueryRow(`SELECT COUNT(*) FROM invoices`).Scan(&invoices)
	fmt.Println("invoices:", invoices)
	fmt.Println("handler calls:", calls["order-1"], calls["order-2"], calls["order-3"])
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(strings.Join(reasons, "\n"))
	// Output:
	// invoices: 2
	// handler calls: 1 6 4
	// poisoned "order-3": panic occurred: "assignment to entry in nil map"
	// poisoned "order-4\x00": inbox: invalid event id: contains a NUL byte: "order-4\x00"
}
