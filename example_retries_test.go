package inbox_test

import (
	"context"
	"encoding/json"
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
// Recoverer, Backoff, then the inbox around the handler function.
//
//   - PoisonQueue takes what is not transient. A transient error reaches
//     it only when the router closes; nacked, the message is redelivered.
//   - Retry retries the handler's own errors and panics a few times, each
//     attempt in a new transaction, then lets them be poisoned; what is
//     permanent (no or a malformed event id, an id reused, a refused
//     wiring, an error the handler marked with inbox.Permanent) goes to
//     the poison queue at once.
//   - Recoverer inside Retry turns a panic into an error that is retried,
//     then poisoned. Outermost, it would catch the panic past Retry and
//     PoisonQueue: the message would be nacked and redelivered forever (on
//     gochannel, thousands of times a second).
//   - Backoff waits out what is transient (the database down, a lost
//     connection, an error the handler marked with inbox.Transient) in
//     place, with a doubling wait and a line per 10 s at most, instead of
//     a nack the broker redelivers at once.
//   - The inbox innermost, by ConsumerHandler whatever the order of the
//     calls: a failed attempt rolls back its claim with its writes.
//
// Here order-1 arrives twice and is invoiced once; order-2's payment API
// answers 503 three times, which the handler marks transient, and the
// fourth call invoices it; order-3 hits a bug; order-4's event id holds a
// NUL byte; order-5's payload is truncated, which the handler marks
// permanent.
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
	backoff, err := inbox.NewBackoff(inbox.BackoffConfig{}, watermill.NopLogger{})
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
		backoff,
	)

	calls := map[string]int{}
	router.AddConsumerHandler("invoicing", "orders", pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		id, _, _ := inbox.EventIDFromContext(msg.Context())
		calls[id]++
		var order struct{ Amount int }
		if err := json.Unmarshal(msg.Payload, &order); err != nil {
			return inbox.Permanent(fmt.Errorf("decoding %s: %w", id, err))
		}
		switch {
		case id == "order-2" && calls[id] <= 3:
			return inbox.Transient(fmt.Errorf("charging %s: payment API answered 503", id))
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
	for _, id := range []string{"order-1", "order-1", "order-2", "order-3", "order-4\x00", "order-5"} {
		payload := `{"amount": 1}`
		if id == "order-5" {
			payload = `{"amount": 1`
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
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
	fmt.Println("handler calls:", calls["order-1"], calls["order-2"], calls["order-3"], calls["order-5"])
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(strings.Join(reasons, "\n"))
	// Output:
	// invoices: 2
	// handler calls: 1 4 4 1
	// poisoned "order-3": panic occurred: "assignment to entry in nil map"
	// poisoned "order-4\x00": inbox: invalid event id: contains a NUL byte: "order-4\x00"
	// poisoned "order-5": decoding order-5: unexpected end of JSON input
}
