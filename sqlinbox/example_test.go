package sqlinbox_test

import (
	"database/sql"
	"fmt"
	"log"
	"strings"

	_ "github.com/lib/pq"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// SchemaSQL is the DDL that CreateSchema runs, for a migration tool. No
// connection is needed to print it.
func ExampleStore_SchemaSQL() {
	db, err := sql.Open("postgres", "postgres://migrations.invalid/app") // opened lazily, never used
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: "billing.inbox"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(store.SchemaSQL())
	// Output:
	// CREATE TABLE IF NOT EXISTS "billing"."inbox" (
	// 	consumer     text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
	// 	event_id     text        NOT NULL,
	// 	processed_at timestamptz NOT NULL DEFAULT now(),
	// 	PRIMARY KEY (consumer, event_id)
	// );
	//
	// CREATE INDEX IF NOT EXISTS "inbox_processed_at_idx" ON "billing"."inbox" (processed_at);
	//
	// CREATE TABLE IF NOT EXISTS "billing"."inbox_leases" (
	// 	consumer text        NOT NULL CHECK (octet_length(consumer) BETWEEN 1 AND 255),
	// 	service  text        NOT NULL CHECK (octet_length(service) BETWEEN 1 AND 255),
	// 	instance text        NOT NULL CHECK (octet_length(instance) BETWEEN 1 AND 255),
	// 	seen_at  timestamptz NOT NULL DEFAULT now(),
	// 	since    timestamptz NOT NULL DEFAULT now(),
	// 	warnings text        NOT NULL DEFAULT '',
	// 	PRIMARY KEY (consumer, service, instance)
	// );
}

// SchemaStatements hands the same DDL statement by statement, for a
// migration tool that takes statements: on a partitioned table one of them
// is a DO block with semicolons of its own, which a tool splitting a script
// at semicolons would cut apart. The last one creates the lease table.
func ExampleStore_SchemaStatements() {
	db, err := sql.Open("postgres", "postgres://migrations.invalid/app") // opened lazily, never used
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily})
	if err != nil {
		log.Fatal(err)
	}
	for _, stmt := range store.SchemaStatements() {
		first, _, _ := strings.Cut(stmt, "\n")
		fmt.Printf("%s, semicolons inside: %t\n", first, strings.Contains(stmt, ";"))
	}
	// Output:
	// CREATE TABLE IF NOT EXISTS "watermill_inbox" (, semicolons inside: false
	// CREATE TABLE IF NOT EXISTS "watermill_inbox_default" PARTITION OF "watermill_inbox" DEFAULT, semicolons inside: false
	// CREATE INDEX IF NOT EXISTS "watermill_inbox_processed_at_idx" ON "watermill_inbox" (processed_at), semicolons inside: false
	// DO $$, semicolons inside: true
	// CREATE TABLE IF NOT EXISTS "watermill_inbox_leases" (, semicolons inside: false
}
