// Command exactly-once-counter is Watermill's exactly-once-delivery-counter
// behind the inbox. Events arrive through watermill-sql, each one -copies
// times over (a relay that published it again); a worker reads a counter and
// writes value+1 in the subscriber's transaction, as Watermill's example
// does, and is killed (SIGKILL) -crashes times mid-stream, right after a
// commit, then restarted. At the end it prints the counts and exits non-zero
// unless the counter equals the number of events.
//
//	go run ./_examples/exactly-once-counter                                        # local PostgreSQL
//	go run ./_examples/exactly-once-counter -dsn 'root@tcp(127.0.0.1:3306)/test'  # MySQL or MariaDB
//	go run ./_examples/exactly-once-counter -no-inbox                              # Watermill's example as it is
//
// It needs a database server: watermill-sql speaks PostgreSQL and MySQL.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

var nop = watermill.NopLogger{}

func main() {
	c := config{}
	flag.StringVar(&c.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL, or MySQL DSN (user@tcp(host:port)/db)")
	flag.IntVar(&c.events, "events", 100, "events to publish")
	flag.IntVar(&c.copies, "copies", 3, "copies of each event")
	flag.IntVar(&c.crashes, "crashes", 2, "workers to kill mid-stream")
	flag.BoolVar(&c.noInbox, "no-inbox", false, "leave the inbox out, as Watermill's example does")
	flag.StringVar(&c.run, "worker", "", "internal: run as the worker of this run")
	flag.IntVar(&c.dieAfter, "die-after", 0, "internal: the worker kills itself after this many counts")
	flag.Parse()
	if c.run != "" {
		if err := worker(c); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := run(c); err != nil {
		log.Fatal(err)
	}
}

type config struct {
	dsn                     string
	events, copies, crashes int
	noInbox                 bool
	run                     string // names this run's tables
	dieAfter                int
}

// database is what differs between PostgreSQL and MySQL.
type database struct {
	*sql.DB
	dialect sqlinbox.Dialect
	schema  interface {
		wsql.SchemaAdapter
		MessagesTable(topic string) string
	}
	offsets interface {
		wsql.OffsetsAdapter
		MessagesOffsetsTable(topic string) string
	}
	param, offsetCol string
}

func open(dsn string) (*database, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		db, err := sql.Open("pgx", dsn)
		return &database{DB: db, dialect: sqlinbox.PostgreSQL, schema: wsql.DefaultPostgreSQLSchema{},
			offsets: wsql.DefaultPostgreSQLOffsetsAdapter{}, param: "$1", offsetCol: `"offset"`}, err
	}
	db, err := sql.Open("mysql", dsn)
	return &database{DB: db, dialect: sqlinbox.MySQL, schema: wsql.DefaultMySQLSchema{},
		offsets: wsql.DefaultMySQLOffsetsAdapter{}, param: "?", offsetCol: "`offset`"}, err
}

// names are one run's tables and topic, fresh each run.
type names struct{ topic, counter, inbox string }

func namesOf(run string) names {
	return names{topic: "counter_" + run, counter: "counter_" + run, inbox: "inbox_" + run}
}

func run(c config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := open(c.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	c.run = strings.ToLower(watermill.NewShortUUID()[:8])
	n := namesOf(c.run)
	defer func() {
		for _, t := range []string{n.counter, n.inbox, db.schema.MessagesTable(n.topic), db.offsets.MessagesOffsetsTable(n.topic)} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + t)
		}
	}()
	if err := setUp(ctx, db, n); err != nil {
		return err
	}

	// The producer: every event several times, as a relay that crashed and
	// published again would.
	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db.DB), wsql.PublisherConfig{SchemaAdapter: db.schema}, nop)
	if err != nil {
		return err
	}
	ids := make([]string, c.events)
	for i := range ids {
		ids[i] = watermill.NewUUID()
	}
	for range c.copies {
		msgs := make([]*message.Message, c.events)
		for i, id := range ids {
			msgs[i] = message.NewMessage(id, []byte(`{}`))
		}
		if err := pub.Publish(n.topic, msgs...); err != nil {
			return err
		}
	}

	// Workers that die mid-stream, each in a process of its own.
	for range c.crashes {
		args := []string{"-worker", c.run, "-dsn", c.dsn, "-die-after", strconv.Itoa(max(c.events/(c.crashes+2), 1))}
		if c.noInbox {
			args = append(args, "-no-inbox")
		}
		cmd := exec.CommandContext(ctx, os.Args[0], args...)
		cmd.Stderr = os.Stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || !exit.Sys().(syscall.WaitStatus).Signaled() {
			return fmt.Errorf("the worker was to be killed, it ended with %v", err)
		}
	}

	// The last worker, in this process, takes the rest.
	c.dieAfter = 0
	router, err := newWorker(db, n, c, nil)
	if err != nil {
		return err
	}
	go func() { _ = router.Run(ctx) }()
	<-router.Running()
	for !drained(ctx, db, n) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the worker did not get through the topic: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := router.Close(); err != nil {
		return err
	}

	var counter int
	if err := db.QueryRowContext(ctx, `SELECT value FROM `+n.counter+` WHERE id = 1`).Scan(&counter); err != nil {
		return err
	}
	fmt.Printf("events published: %d, each %d times (%d messages)\n", c.events, c.copies, c.events*c.copies)
	fmt.Printf("workers killed:   %d, mid-stream\n", c.crashes)
	fmt.Printf("counter:          %d\n", counter)
	if counter != c.events {
		return fmt.Errorf("the counter is %d, want %d: each event must count once", counter, c.events)
	}
	fmt.Println("every event counted exactly once")
	return nil
}

func setUp(ctx context.Context, db *database, n names) error {
	for _, stmt := range []string{
		`CREATE TABLE ` + n.counter + ` (id INT PRIMARY KEY, value INT NOT NULL)`,
		`INSERT INTO ` + n.counter + ` (id, value) VALUES (1, 0)`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	store, err := sqlinbox.New(db.DB, sqlinbox.Config{Dialect: db.dialect, Table: n.inbox})
	if err != nil {
		return err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return err
	}
	sub, err := subscriber(db)
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(n.topic)
}

func subscriber(db *database) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db.DB), wsql.SubscriberConfig{
		SchemaAdapter: db.schema, OffsetsAdapter: db.offsets,
		PollInterval: 10 * time.Millisecond, ResendInterval: 10 * time.Millisecond,
	}, nop)
}

// worker runs until it kills itself.
func worker(c config) error {
	db, err := open(c.dsn)
	if err != nil {
		return err
	}
	router, err := newWorker(db, namesOf(c.run), c, func(ctx context.Context) error {
		return syscall.Kill(os.Getpid(), syscall.SIGKILL)
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = router.Run(ctx)
	return errors.New("the worker ran out of events before it was killed")
}

// newWorker is Watermill's counter worker, with the inbox added in one line
// (unless -no-inbox). die, when set, runs after the c.dieAfter-th count is
// committed.
func newWorker(db *database, n names, c config, die func(context.Context) error) (*message.Router, error) {
	sub, err := subscriber(db)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{}, nop)
	if err != nil {
		return nil, err
	}
	var counted atomic.Int64
	handler := func(msg *message.Message) error {
		if err := count(msg, db, n); err != nil {
			return err
		}
		if die != nil && counted.Add(1) == int64(c.dieAfter) {
			if c.noInbox {
				// Watermill's example commits in the subscriber, after the ack.
				return die(msg.Context())
			}
			return inbox.AfterCommit(msg.Context(), die)
		}
		return nil
	}
	if !c.noInbox {
		store, err := sqlinbox.New(db.DB, sqlinbox.Config{Dialect: db.dialect, Table: n.inbox})
		if err != nil {
			return nil, err
		}
		mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Logger: router.Logger()})
		if err != nil {
			return nil, err
		}
		handler = inbox.ConsumerHandler(mw, handler) // the one line
	}
	router.AddConsumerHandler("counter", n.topic, sub, handler)
	return router, nil
}

// count is the handler of Watermill's example, unchanged in substance: it
// reads the counter and writes value+1 in the transaction watermill-sql's
// TxFromContext returns. Behind the inbox that is the transaction holding
// the event's claim (inbox.TxFromContext returns it too), so the new value
// commits with the claim, or neither does.
func count(msg *message.Message, db *database, n names) error {
	ctx := msg.Context()
	tx, ok := wsql.TxFromContext(ctx)
	if !ok {
		return errors.New("no transaction in the message context")
	}
	rows, err := tx.QueryContext(ctx, `SELECT value FROM `+n.counter+` WHERE id = 1`)
	if err != nil {
		return err
	}
	var value int
	if !rows.Next() {
		return errors.Join(errors.New("the counter row cannot be read"), rows.Close())
	}
	if err := errors.Join(rows.Scan(&value), rows.Close()); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE `+n.counter+` SET value = `+db.param+` WHERE id = 1`, value+1)
	return err
}

// drained reports whether the worker has acked the topic's last message.
func drained(ctx context.Context, db *database, n names) bool {
	var last, acked sql.NullInt64
	messages := db.schema.MessagesTable(n.topic)
	if db.QueryRowContext(ctx, `SELECT MAX(`+db.offsetCol+`) FROM `+messages).Scan(&last) != nil {
		return false
	}
	if db.QueryRowContext(ctx, `SELECT MAX(offset_acked) FROM `+db.offsets.MessagesOffsetsTable(n.topic)).Scan(&acked) != nil {
		return false
	}
	return last.Valid && acked.Valid && acked.Int64 >= last.Int64
}
