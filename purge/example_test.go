package purge_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	_ "modernc.org/sqlite"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A claim from 20 days ago is purged with a 14-day retention; yesterday's
// stays, so its redelivery is still a duplicate.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "purge-example")
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
	// Two claims, as the middleware would have made them back then.
	_, _ = db.Exec(`INSERT INTO watermill_inbox (consumer, event_id, processed_at) VALUES
		('invoicing', 'order-1', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-20 days')),
		('invoicing', 'order-2', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 days'))`)

	_, err = purge.New(store, purge.Config{Retention: time.Hour})
	fmt.Println(err != nil) // below the 24h floor: refused

	p, err := purge.New(store, purge.Config{Retention: 14 * 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	deleted, err := p.PurgeOnce(ctx)
	if err != nil && !errors.Is(err, purge.ErrSkipped) {
		log.Fatal(err)
	}
	fmt.Println("purged:", deleted)

	tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "invoicing", EventID: "order-2"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("order-2 processed again:", tx != nil)
	// Output:
	// true
	// purged: 1
	// order-2 processed again: false
}

// DryRun counts, per consumer, what a round would remove now and removes
// nothing: a look before the first purge of an old table, or before
// shortening a retention. Here mailing keeps its claims for 30 days.
func ExamplePurger_DryRun() {
	db, store, done := exampleStore()
	defer done()
	_, _ = db.Exec(`INSERT INTO watermill_inbox (consumer, event_id, processed_at) VALUES
		('invoicing', 'order-1', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-40 days')),
		('invoicing', 'order-2', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-20 days')),
		('invoicing', 'order-3', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 days')),
		('mailing', 'order-1', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-40 days')),
		('mailing', 'order-2', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-20 days'))`)

	p, err := purge.New(store, purge.Config{
		Retention:         14 * 24 * time.Hour,
		ConsumerRetention: map[string]time.Duration{"mailing": 30 * 24 * time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	counts, err := p.DryRun(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	for _, consumer := range slices.Sorted(maps.Keys(counts)) {
		fmt.Printf("%s: %d\n", consumer, counts[consumer])
	}
	var left int
	_ = db.QueryRow(`SELECT count(*) FROM watermill_inbox`).Scan(&left)
	fmt.Println("rows left:", left)
	// Output:
	// invoicing: 2
	// mailing: 1
	// rows left: 5
}

// exampleStore opens a fresh SQLite database with an inbox table; done
// closes and removes it.
func exampleStore() (db *sql.DB, store *sqlinbox.Store, done func()) {
	dir, err := os.MkdirTemp("", "purge-example")
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
	return db, store, done
}
