package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The same event delivered three times, in three different envelopes: the
// handler runs once and writes one invoice.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "inbox-example")
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
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	_, _ = db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`)

	// In a router: router.AddMiddleware(mw). Consumer is needed here only
	// because there is no router to name the handler.
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "invoicing"})
	if err != nil {
		log.Fatal(err)
	}
	handler := mw(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return nil, inbox.ErrNotInInbox
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES (?)`, msg.Metadata.Get("event_id"))
		fmt.Println("invoicing", msg.Metadata.Get("event_id"))
		return nil, err
	})

	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.Metadata.Set("event_id", "order-1")
		if _, err := handler(msg); err != nil {
			log.Fatal(err)
		}
	}
	var invoices int
	_ = db.QueryRow(`SELECT COUNT(*) FROM invoices`).Scan(&invoices)
	fmt.Println("invoices:", invoices)
	// Output:
	// invoicing order-1
	// invoices: 1
}

// A handler error rolls back the claim with the handler's writes, so the
// redelivery is processed as if the failed attempt never happened.
func ExampleTxFromContext() {
	db, store, done := exampleStore()
	defer done()
	mw, _ := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "stock"})

	attempts := 0
	handler := mw(func(msg *message.Message) ([]*message.Message, error) {
		attempts++
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return nil, inbox.ErrNotInInbox
		}
		if _, err := tx.ExecContext(msg.Context(), `UPDATE stock SET units = units - 1`); err != nil {
			return nil, err
		}
		if attempts == 1 {
			return nil, errors.New("warehouse API timed out")
		}
		return nil, nil
	})

	msg := message.NewMessage("event-7", nil)
	for range 3 { // the broker redelivers until acked, then once more
		_, err := handler(msg.Copy())
		fmt.Println("attempt error:", err)
	}
	var units int
	_ = db.QueryRow(`SELECT units FROM stock`).Scan(&units)
	fmt.Println("units left:", units)
	// Output:
	// attempt error: warehouse API timed out
	// attempt error: <nil>
	// attempt error: <nil>
	// units left: 9
}

// AfterCommit runs an effect that cannot join the transaction once the
// claim is committed: never for a failed attempt, never for a duplicate.
func ExampleAfterCommit() {
	_, store, done := exampleStore()
	defer done()
	mw, _ := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "mailer"})

	fail := true
	handler := mw(func(msg *message.Message) ([]*message.Message, error) {
		_ = inbox.AfterCommit(msg.Context(), func(context.Context) error {
			fmt.Println("email sent for", msg.UUID)
			return nil
		})
		if fail {
			fail = false
			return nil, errors.New("template not found")
		}
		return nil, nil
	})

	msg := message.NewMessage("signup-42", nil)
	for range 3 {
		_, _ = handler(msg.Copy())
	}
	// Output:
	// email sent for signup-42
}

// A hook registered after the handler returned, from a goroutine or with a
// context kept past the handler, would never run: AfterCommit refuses it.
func ExampleAfterCommit_afterTheHandler() {
	_, store, done := exampleStore()
	defer done()
	mw, _ := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "mailer"})

	returned, registered := make(chan struct{}), make(chan error)
	handler := mw(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		go func() {
			<-returned
			registered <- inbox.AfterCommit(ctx, func(context.Context) error { return nil })
		}()
		return nil, nil
	})
	_, _ = handler(message.NewMessage("signup-43", nil))
	close(returned)
	err := <-registered
	fmt.Println(errors.Is(err, inbox.ErrTxEnded))
	// Output:
	// true
}

// exampleStore opens a fresh SQLite database with an inbox table and a
// stock table holding 10 units; done closes and removes it.
func exampleStore() (db *sql.DB, store *sqlinbox.Store, done func()) {
	dir, err := os.MkdirTemp("", "inbox-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err = sql.Open("sqlite", sqlinbox.SQLiteDSN(filepath.Join(dir, "app.db")))
	if err != nil {
		log.Fatal(err)
	}
	done = func() {
		_ = db.Close()
		_ = os.RemoveAll(dir)
	}
	store, err = sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(context.Background()); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE stock (units INTEGER NOT NULL); INSERT INTO stock VALUES (10)`); err != nil {
		log.Fatal(err)
	}
	return db, store, done
}

// The time a UUIDv7 or a ULID event id carries: what a table partitioned
// by sqlinbox.EventIDTime splits by, and what MaxEventAge can age events
// by, with EventTimeFromEventID.
func ExampleTimeInEventID() {
	for _, id := range []string{
		"017f22e2-79b0-7cc3-98c4-dc0c0c07398f", // UUIDv7
		"01FWHE4YDG7V1ZYXG2PK1JSEH8",           // ULID, as watermill.NewULID makes
		"4d9a9c3e-8f0e-4f6b-9a57-7a2c4f1f3b2d", // UUIDv4: random, no time
	} {
		at, ok := inbox.TimeInEventID(id)
		fmt.Println(at.Format(time.RFC3339Nano), ok)
	}
	// Output:
	// 2022-02-22T19:22:22Z true
	// 2022-02-22T19:22:22Z true
	// 0001-01-01T00:00:00Z false
}
