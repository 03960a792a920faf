// Command invoicing is the invoicing service of the inbox pattern's story:
// orders in; an invoice, its PDF and an email out. The invoice is written
// exactly once behind the inbox, although every order arrives several times
// (the four causes: a relay that publishes twice, a consumer that crashes
// after its commit and before its ack, a rebalance, an operator's replay).
// The email cannot join the transaction, so it is sent two ways, side by
// side, each at least once:
//
//   - job queue: the handler inserts a River job in the inbox transaction
//     (InsertTx) and River's workers send the email, with River's retries
//     and its rescue of jobs whose worker died;
//   - sweeper: the handler leaves the invoice marked unsent, and a sweeper
//     sends every unsent invoice, round after round.
//
// The mail server is a real SMTP server in the process, which greylists some
// first attempts (a temporary failure both variants must retry) and counts
// what it accepted by Message-ID. The Message-ID comes from the order
// event's id, so a receiver can drop a second copy: with -kill, the senders
// first run as processes that SIGKILL themselves right after the server
// accepted an email and before they recorded it sent, and that email goes
// out twice. The program fails unless every order has exactly one invoice
// and at least one email, and every duplicate email is one a killed sender
// had sent.
//
//	go run .                          # embedded SQLite, nothing to install
//	go run . -kill                    # the senders killed once each: duplicate emails, explained
//	go run . -dsn 'postgres://...'    # PostgreSQL, this run's tables in a schema of their own
//
// It is a module of its own (River and an SMTP server are its dependencies):
// run it from its directory.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// quietLogger keeps River's log to warnings.
var quietLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func main() {
	dsn := flag.String("dsn", "", "PostgreSQL URL (default: an embedded SQLite file)")
	orders := flag.Int("orders", 20, "orders to place")
	kill := flag.Bool("kill", false, "run each variant's sender first as a process that SIGKILLs itself between the mail server's acceptance and its record of the send")
	var c child
	flag.StringVar(&c.via, "child", "", "internal: run as the -kill sender of this variant (queue or sweeper)")
	flag.StringVar(&c.sqlite, "sqlite", "", "internal: the run's SQLite file, for -child")
	flag.StringVar(&c.schema, "schema", "", "internal: the run's PostgreSQL schema, for -child")
	flag.StringVar(&c.mail, "smtp", "", "internal: the mail server's address, for -child")
	flag.Parse()
	var err error
	if c.via != "" {
		c.dsn = *dsn
		err = c.run()
	} else {
		err = run(*dsn, *orders, *kill)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// openDB opens the run's database: the SQLite file at sqlitePath, or
// PostgreSQL at dsn with its tables in schema.
func openDB(dsn, sqlitePath, schema string) (db, sqlinbox.Dialect, error) {
	if dsn == "" {
		// SQLiteDSN sets what concurrent writers (several processes, here)
		// need: a busy timeout, WAL, and BEGIN IMMEDIATE.
		d, err := sql.Open("sqlite", sqlinbox.SQLiteDSN(sqlitePath))
		return db{DB: d, river: riversqlite.New(d)}, sqlinbox.SQLite, err
	}
	d, err := sql.Open("pgx", dsn)
	return db{DB: d, river: riverdatabasesql.New(d), schema: schema}, sqlinbox.PostgreSQL, err
}

func run(dsn string, orders int, kill bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "invoicing")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	where := "SQLite"
	sqlitePath, schema := filepath.Join(dir, "invoicing.db"), ""
	if dsn != "" {
		where, schema = "PostgreSQL", "invoicing_"+strings.ToLower(watermill.NewShortUUID()[:8])
	}
	d, dialect, err := openDB(dsn, sqlitePath, schema)
	if err != nil {
		return err
	}
	defer d.Close()
	store, err := createTables(ctx, d, dialect)
	if d.schema != "" {
		defer func() { _, _ = d.Exec(`DROP SCHEMA IF EXISTS ` + d.schema + ` CASCADE`) }()
	}
	if err != nil {
		return err
	}

	mail, stopMail, err := startMailServer(6)
	if err != nil {
		return err
	}
	defer stopMail()
	svc, err := newService(d, "service", mail.addr, true)
	if err != nil {
		return err
	}
	sendersCtx, stopSenders := context.WithCancel(ctx)
	defer stopSenders()
	startSenders := func() error {
		go svc.runSweeper(sendersCtx, 200*time.Millisecond)
		return svc.jobs.Start(sendersCtx)
	}
	if !kill {
		if err := startSenders(); err != nil {
			return err
		}
	}

	fmt.Printf("invoicing: %d orders on %s, each invoice emailed two ways (a River job; a sweeper)\n", orders, where)
	stats, err := consume(ctx, svc, store, orders)
	if err != nil {
		return err
	}
	fmt.Printf("every order delivered at least once to each handler, and again for the four causes of duplicates:\n")
	fmt.Printf("  %d published twice by the relay, %d redelivered after the consumer crashed before its ack, %d replayed after a rebalance, %d replayed by an operator\n",
		stats.relayTwice, stats.crashedBeforeAck, stats.rebalanced, stats.replayed)

	killed := map[string]bool{}
	if kill {
		for _, via := range []string{viaQueue, viaSweeper} {
			c := child{via: via, dsn: dsn, sqlite: sqlitePath, schema: schema, mail: mail.addr}
			id, err := c.start(ctx)
			if err != nil {
				return err
			}
			killed[c.name()] = true
			fmt.Printf("killed the %s sender (SIGKILL) after the mail server accepted %s, before it recorded the send\n", via, id)
		}
		// The killed worker's jobs are still "running": River works them
		// again once they have run for RescueStuckJobsAfter.
		fmt.Printf("waiting %s for River to rescue the jobs the killed worker left running\n", rescueStuckJobsAfter)
		time.Sleep(rescueStuckJobsAfter)
		if err := startSenders(); err != nil {
			return err
		}
	}
	if err := waitAllSent(ctx, d); err != nil {
		return err
	}
	stopSenders()
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStop()
	if err := svc.jobs.Stop(stopCtx); err != nil {
		return err
	}
	return report(ctx, d, mail, stats, killed)
}

// createTables applies River's migrations and creates the inbox and the
// invoices. The invoices have no unique key, so that a second invoice for
// an order would show.
func createTables(ctx context.Context, d db, dialect sqlinbox.Dialect) (*sqlinbox.Store, error) {
	if d.schema != "" {
		if _, err := d.ExecContext(ctx, `CREATE SCHEMA `+d.schema); err != nil {
			return nil, err
		}
	}
	migrator, err := rivermigrate.New(d.river, &rivermigrate.Config{Schema: d.schema, Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("River's migrations: %w", err)
	}
	if _, err := d.ExecContext(ctx, `CREATE TABLE `+d.table("invoices")+` (via TEXT NOT NULL, event_id TEXT NOT NULL,
		order_id TEXT NOT NULL, customer TEXT NOT NULL, amount_cents BIGINT NOT NULL, pdf TEXT NOT NULL, email_sent_ms BIGINT)`); err != nil {
		return nil, err
	}
	store, err := sqlinbox.New(d.DB, sqlinbox.Config{Dialect: dialect, Table: d.table("watermill_inbox")})
	if err != nil {
		return nil, err
	}
	return store, store.CreateSchema(ctx)
}

// deliveryStats counts, per handler, what the broker delivered and what
// the inbox let through.
type deliveryStats struct {
	eventIDs                                           []string
	relayTwice, crashedBeforeAck, rebalanced, replayed int
	delivered, handled                                 map[string]*atomic.Int64 // by handler name
}

// consume runs both handlers behind the inbox and publishes the orders,
// with the duplicates of the four causes, on Watermill's in-memory broker.
func consume(ctx context.Context, svc *service, store *sqlinbox.Store, orders int) (*deliveryStats, error) {
	handlers := map[string]message.NoPublishHandlerFunc{
		"invoicing-" + viaQueue:   svc.invoiceAndQueueEmail,
		"invoicing-" + viaSweeper: svc.invoiceForSweeper,
	}
	stats := &deliveryStats{delivered: map[string]*atomic.Int64{}, handled: map[string]*atomic.Int64{}}
	for name := range handlers {
		stats.delivered[name], stats.handled[name] = new(atomic.Int64), new(atomic.Int64)
	}
	// One inbox table; the consumer is the handler name, so each handler
	// processes each event once.
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	if err != nil {
		return nil, err
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	// Outside the inbox: the count of deliveries, and a consumer that
	// crashes after its commit and before its ack (an error from here makes
	// the broker deliver the message again) at every fifth event.
	var (
		mu      sync.Mutex
		seen    = map[string]map[string]bool{} // by handler: the events it committed
		crashed int
	)
	router.AddMiddleware(middleware.Recoverer, func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			name := message.HandlerNameFromCtx(msg.Context())
			stats.delivered[name].Add(1)
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[name] == nil {
				seen[name] = map[string]bool{}
			}
			if !seen[name][msg.UUID] {
				seen[name][msg.UUID] = true
				if len(seen[name])%5 == 0 {
					crashed++
					return nil, errors.New("consumer crashed after its commit, before its ack")
				}
			}
			return out, nil
		}
	})
	for name, h := range handlers {
		router.AddConsumerHandler(name, "orders", pubSub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
			if err := h(msg); err != nil {
				return err
			}
			return inbox.AfterCommit(msg.Context(), func(context.Context) error { stats.handled[name].Add(1); return nil })
		}))
	}
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	var msgs []*message.Message
	publish := func(msg *message.Message) error { return pubSub.Publish("orders", msg.Copy()) } // returns once both handlers acked
	for i := 1; i <= orders; i++ {
		payload, _ := json.Marshal(order{ID: fmt.Sprintf("order-%d", i), Customer: fmt.Sprintf("customer-%d@mail.example", i), AmountCents: int64(1990 + 250*i)})
		msg := message.NewMessage(watermill.NewUUID(), payload) // the event id: msg.UUID, kept by every copy
		msgs = append(msgs, msg)
		stats.eventIDs = append(stats.eventIDs, msg.UUID)
		if err := publish(msg); err != nil {
			return nil, err
		}
		if i%4 == 0 { // 1. the relay crashed after publishing, before recording it
			stats.relayTwice++
			if err := publish(msg); err != nil {
				return nil, err
			}
		}
	}
	for _, msg := range msgs[max(0, len(msgs)-4):] { // 3. a rebalance: the new owner re-reads the uncommitted tail
		stats.rebalanced++
		if err := publish(msg); err != nil {
			return nil, err
		}
	}
	for _, msg := range msgs { // 4. an operator replays the topic
		stats.replayed++
		if err := publish(msg); err != nil {
			return nil, err
		}
	}
	stats.crashedBeforeAck = crashed / len(handlers) // 2., counted per handler
	return stats, router.Close()
}

// waitAllSent waits until every invoice's email is recorded sent and every
// job is completed.
func waitAllSent(ctx context.Context, d db) error {
	for {
		var unsent, unfinished int
		err := d.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+d.table("invoices")+` WHERE email_sent_ms IS NULL),
			(SELECT count(*) FROM `+d.table("river_job")+` WHERE state <> 'completed')`).Scan(&unsent, &unfinished)
		if err != nil {
			return err
		}
		if unsent == 0 && unfinished == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d invoices unsent, %d jobs not completed: %w", unsent, unfinished, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// report prints the counts of both variants and checks the guarantee: one
// invoice per order, every order emailed, and every duplicate email a copy
// that a killed sender had sent.
func report(ctx context.Context, d db, mail *mailServer, stats *deliveryStats, killed map[string]bool) error {
	orders := len(stats.eventIDs)
	accepted := mail.accepted()
	var problems []string
	fmt.Printf("\n%-34s %10s %10s\n", "", "job queue", "sweeper")
	type column struct{ delivered, skipped, invoices, distinct, emails, emailed, duplicates, fromKilled, greylisted int }
	var cols [2]column
	for i, via := range []string{viaQueue, viaSweeper} {
		c := &cols[i]
		name := "invoicing-" + via
		c.delivered = int(stats.delivered[name].Load())
		c.skipped = c.delivered - int(stats.handled[name].Load())
		if err := d.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT event_id) FROM `+d.table("invoices")+` WHERE via = $1`, via).Scan(&c.invoices, &c.distinct); err != nil {
			return err
		}
		for _, id := range stats.eventIDs {
			senders := accepted[messageID(via, id)]
			if len(senders) > 0 {
				c.emailed++
			}
			c.emails += len(senders)
			if len(senders) > 1 {
				c.duplicates += len(senders) - 1
				// Every copy but the last must come from a killed sender.
				if !slices.ContainsFunc(senders[:len(senders)-1], func(s string) bool { return !killed[s] }) {
					c.fromKilled += len(senders) - 1
				}
			}
		}
		c.greylisted = mail.greylistedFrom(sender(via))
		if c.invoices != orders || c.distinct != orders {
			problems = append(problems, fmt.Sprintf("%s: %d invoices for %d orders, want one each", via, c.invoices, c.distinct))
		}
		if c.emailed != orders {
			problems = append(problems, fmt.Sprintf("%s: %d of %d orders emailed", via, c.emailed, orders))
		}
		if c.fromKilled != c.duplicates {
			problems = append(problems, fmt.Sprintf("%s: %d duplicate emails not sent by a killed sender", via, c.duplicates-c.fromKilled))
		}
		if len(killed) > 0 && c.duplicates == 0 {
			problems = append(problems, fmt.Sprintf("%s: a sender was killed after the acceptance, yet no email went out twice", via))
		}
	}
	row := func(label string, f func(column) int, note string) {
		fmt.Println(strings.TrimRight(fmt.Sprintf("  %-32s %10d %10d   %s", label, f(cols[0]), f(cols[1]), note), " "))
	}
	row("deliveries", func(c column) int { return c.delivered }, "")
	row("duplicates skipped by the inbox", func(c column) int { return c.skipped }, "")
	row("invoices (with their PDF)", func(c column) int { return c.invoices }, fmt.Sprintf("one per order (%d)", orders))
	row("emails accepted", func(c column) int { return c.emails }, "")
	row("  orders emailed", func(c column) int { return c.emailed }, "every order at least once")
	row("  duplicate emails", func(c column) int { return c.duplicates }, "same Message-ID: the receiver drops them")
	row("    sent by a killed sender", func(c column) int { return c.fromKilled }, "accepted, then killed before it recorded the send")
	row("greylisted, sent again later", func(c column) int { return c.greylisted }, "a temporary failure, retried")

	var jobs, completed, jobEvents int
	if err := d.QueryRowContext(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'completed'), count(DISTINCT args->>'event_id')
		FROM `+d.table("river_job")).Scan(&jobs, &completed, &jobEvents); err != nil {
		return err
	}
	fmt.Printf("River: %d jobs for %d orders, %d completed\n", jobs, jobEvents, completed)
	if jobs != orders || jobEvents != orders || completed != orders {
		problems = append(problems, fmt.Sprintf("%d email jobs for %d orders (%d completed), want one each", jobs, jobEvents, completed))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Println("ok: exactly one invoice per order in both variants, every order emailed at least once, and every duplicate email sent by a killed sender")
	return nil
}
