// Command inbox-soak proves the inbox's guarantee under faults, at scale:
// it publishes deliveries to an in-process Kafka broker (kfake), about 30%
// of them copies of earlier events, and consumes them with a consumer group
// behind the inbox middleware on PostgreSQL while it injects, in turn:
//
//   - a member killed right after a commit, before its ack reaches Kafka;
//   - members leaving and joining the group (rebalances replay offsets);
//   - pg_terminate_backend on the consumers' backends inside a transaction;
//   - a cut of every consumer connection at a TCP proxy (toxiproxy);
//   - handler errors and panics after the effect was written.
//
// At the end it reads the effect table and the inbox table and prints a
// table: every event must have exactly one effect, none missing. It exits
// non-zero on any violation.
//
// From internal/testing, the test rig's module:
//
//	go run ./cmd/inbox-soak                                # 100,000 deliveries
//	go run ./cmd/inbox-soak -deliveries 1000000 -progress  # the full soak
//	go run ./cmd/inbox-soak -dsn 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

func main() {
	if raw := os.Getenv(childEnv); raw != "" {
		fmt.Fprintln(os.Stderr, "inbox-soak consumer:", runChild(raw))
		os.Exit(1)
	}
	o := options{}
	var progress bool
	flag.IntVar(&o.deliveries, "deliveries", 100_000, "records to publish, duplicates included")
	flag.Float64Var(&o.dupRatio, "dup", 0.3, "share of deliveries that are copies of an earlier event")
	flag.IntVar(&o.partitions, "partitions", 8, "partitions of the topic")
	flag.IntVar(&o.members, "members", 3, "consumer group members at most, in this process")
	flag.StringVar(&o.driver, "driver", "pgx-stdlib", "the store and driver: "+strings.Join(stream.Drivers, ", "))
	flag.StringVar(&o.dsn, "dsn", "", "the database: a PostgreSQL URL, a go-sql-driver/mysql DSN, a SQLite file (default: INBOX_TEST_POSTGRES_DSN or INBOX_TEST_MYSQL_DSN, else the local server; a temporary SQLite file)")
	flag.BoolVar(&o.children, "process-kills", true, "run a consumer in a child process too, and SIGKILL it among the faults")
	flag.IntVar(&o.faultEvery, "fault-every", 0, "committed records between two injected faults (default: deliveries/100)")
	flag.Float64Var(&o.errRate, "errors", 0.01, "share of handler calls that return an error after writing the effect")
	flag.Float64Var(&o.panicRate, "panics", 0.005, "share of handler calls that panic after writing the effect")
	flag.BoolVar(&o.keep, "keep", false, "keep the inbox and effect tables (MySQL: and the database the soak creates for them)")
	flag.BoolVar(&progress, "progress", false, "print progress to stderr")
	flag.Parse()
	if o.dsn == "" {
		o.dsn = defaultDSN(o.driver)
	}
	if o.faultEvery <= 0 {
		o.faultEvery = max(1, o.deliveries/100)
	}
	if progress {
		o.progress = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, _, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inbox-soak:", err)
		os.Exit(1)
	}
	if v := res.violations(); v > 0 {
		fmt.Fprintf(os.Stderr, "inbox-soak: %d violations of exactly-once\n", v)
		os.Exit(1)
	}
}

// defaultDSN is the test database of driver's dialect (empty for SQLite:
// a temporary file).
func defaultDSN(driver string) string {
	switch driver {
	case "mysql":
		return envOr("INBOX_TEST_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
	case "sqlite":
		return ""
	}
	return envOr("INBOX_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
