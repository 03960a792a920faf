package jobqueue_test

import (
	"bytes"
	"context"
	stdsql "database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
	"github.com/watermill-inbox/inbox/observe"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// River's timings. Killed processes leave jobs "running"; River's rescuer
// makes them retryable once they have run longer than RescueStuckJobsAfter,
// which must be at least JobTimeout. The rescuer runs on the leader, first
// when it is elected, then every 30 s; so the processes that are killed do
// not run for leader (a killed leader would keep the leadership for its TTL,
// 15 s), and the last process, elected at once, rescues every job the kills
// left behind in its first round. A send that outlives JobTimeout still
// completes: the worker does not give the send its context.
const (
	jobTimeout  = 3 * time.Second
	rescueAfter = 5 * time.Second
)

// sendInvoiceEmail is the River job that the invoicing handler inserts in
// the inbox transaction. EventID is the order event's id: the email's
// idempotency key, sent as its Message-ID.
type sendInvoiceEmail struct {
	EventID string `json:"event_id"`
	OrderID string `json:"order_id"`
	To      string `json:"to"`
}

func (sendInvoiceEmail) Kind() string { return "send_invoice_email" }

// messageID is the Message-ID of every copy of the email for an event.
func messageID(eventID string) string { return "<" + eventID + "@invoicing.test>" }

type order struct {
	ID          string `json:"id"`
	N           int    `json:"n"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// names is where a process of the service finds everything; the test
// creates it and hands it to its child processes.
type names struct {
	DSN      string // PostgreSQL, tagged with the process's application name
	Brokers  []string
	Topic    string
	Inbox    string // the inbox table
	Invoices string // the invoice table
	River    string // River's schema
	SMTP     string // the mailbox's address
}

// backend is one way to run the service: an inbox store and a River driver
// on one database, and the handler's access to the transaction they share.
type backend[TTx any] struct {
	store interface {
		inboxdriver.Store
		CreateSchema(context.Context) error
	}
	driver riverdriver.Driver[TTx]
	tx     func(ctx context.Context) (TTx, bool)
	exec   func(ctx context.Context, tx TTx, query string, args ...any) error
}

// pgxBackend is pgxinbox with riverpgxv5, both on one pgx pool.
func pgxBackend(t testing.TB, n names) backend[pgx.Tx] {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), n.DSN)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{Table: n.Inbox})
	require.NoError(t, err)
	return backend[pgx.Tx]{
		store: store, driver: riverpgxv5.New(pool), tx: pgxinbox.TxFromContext,
		exec: func(ctx context.Context, tx pgx.Tx, query string, args ...any) error {
			_, err := tx.Exec(ctx, query, args...)
			return err
		},
	}
}

// sqlBackend is sqlinbox with riverdatabasesql, both on one database/sql
// pool (pgx's stdlib driver).
func sqlBackend(t testing.TB, n names) backend[*stdsql.Tx] {
	t.Helper()
	db := testdb.Open(t, "pgx", n.DSN)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: n.Inbox})
	require.NoError(t, err)
	return backend[*stdsql.Tx]{
		store: store, driver: riverdatabasesql.New(db), tx: inbox.TxFromContext,
		exec: func(ctx context.Context, tx *stdsql.Tx, query string, args ...any) error {
			_, err := tx.ExecContext(ctx, query, args...)
			return err
		},
	}
}

// hooks are where a process can be made to die; each gets the event id.
type hooks struct {
	afterCommit func(eventID string) // the invoice and its job committed
	beforeSend  func(eventID string) // a worker took the job, nothing sent yet
	afterAccept func(eventID string) // the SMTP server accepted the email, the job not completed
}

// process is one process of the invoicing service: a Watermill router that
// consumes orders behind the inbox and writes each invoice and its email job
// in the inbox transaction, and a River client whose workers send the emails.
type process[TTx any] struct {
	name  string // also its EHLO name, which the mailbox records
	n     names
	b     backend[TTx]
	hooks hooks
	river *river.Client[TTx]

	failed    sync.Map // order event ids whose first attempt failed on purpose
	Delivered atomic.Int64
	Skipped   atomic.Int64 // duplicates the inbox acked without calling the handler
}

// errAfterInsert fails an attempt after its job was inserted: the rollback
// must take the job with the invoice and the claim.
var errAfterInsert = errors.New("failing on purpose after the job insert")

// handle writes the invoice and inserts its email job, both through the
// inbox transaction. The first attempt at every fourth order fails after the
// insert, so a job that escaped the transaction would show up twice.
func (p *process[TTx]) handle(msg *message.Message) error {
	ctx := msg.Context()
	tx, ok := p.b.tx(ctx)
	if !ok {
		return errors.New("no inbox transaction")
	}
	eventID, _, _ := inbox.EventIDFromContext(ctx)
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return err
	}
	if err := p.b.exec(ctx, tx, `INSERT INTO `+p.n.Invoices+` (order_id, event_id, amount_cents) VALUES ($1, $2, $3)`,
		o.ID, eventID, o.AmountCents); err != nil {
		return fmt.Errorf("writing the invoice: %w", err)
	}
	if _, err := p.river.InsertTx(ctx, tx, sendInvoiceEmail{EventID: eventID, OrderID: o.ID, To: o.Customer}, nil); err != nil {
		return fmt.Errorf("inserting the email job: %w", err)
	}
	if _, again := p.failed.LoadOrStore(eventID, true); o.N%4 == 0 && !again {
		return errAfterInsert
	}
	if p.hooks.afterCommit == nil {
		return nil
	}
	return inbox.AfterCommit(ctx, func(context.Context) error { p.hooks.afterCommit(eventID); return nil })
}

// Start implements observe.Observer: the process counts deliveries and skipped
// duplicates.
func (p *process[TTx]) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	p.Delivered.Add(1)
	return ctx, func(o observe.Observation) {
		if o.Outcome == observe.Duplicate {
			p.Skipped.Add(1)
		}
	}
}

// start runs the process until the test ends or stop is called. leader
// says whether its River client runs for leader, hence rescues stuck jobs.
func (p *process[TTx]) start(t testing.TB, leader bool) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	workers := river.NewWorkers()
	river.AddWorker(workers, &emailWorker{smtp: p.n.SMTP, helo: p.name, hooks: p.hooks})
	var err error
	p.river, err = river.NewClient(p.b.driver, &river.Config{
		Schema:                 p.n.River,
		Queues:                 map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:                workers,
		FetchCooldown:          20 * time.Millisecond,
		FetchPollInterval:      100 * time.Millisecond, // riverdatabasesql polls: it has no listener
		JobTimeout:             jobTimeout,
		RescueStuckJobsAfter:   rescueAfter,
		RetryPolicy:            retryAtOnce{},
		LeaderElectionDisabled: !leader,
		Logger:                 slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	require.NoError(t, err)
	require.NoError(t, p.river.Start(ctx))

	mw, err := inbox.NewMiddleware(inbox.Config{Store: p.b.store, Observer: p})
	require.NoError(t, err)
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               p.n.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: kafkatest.SubscriberConfig(time.Second),
		ConsumerGroup:         "invoicing",
		NackResendSleep:       20 * time.Millisecond,
		ReconnectRetrySleep:   100 * time.Millisecond,
	}, watermill.NopLogger{})
	require.NoError(t, err)
	router.AddConsumerHandler("invoicing", p.n.Topic, sub, inbox.ConsumerHandler(mw, p.handle))
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-done:
		t.Fatalf("%s: router stopped at start: %v", p.name, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			require.NoError(t, router.Close())
			require.NoError(t, <-done)
			stopCtx, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer stopCancel()
			require.NoError(t, p.river.Stop(stopCtx))
			cancel()
		})
	}
	t.Cleanup(stop)
	return stop
}

// retryAtOnce schedules a rescued or failed job's next attempt now, so it
// waits only for River's scheduler (every 5 s) rather than a backoff.
type retryAtOnce struct{}

func (retryAtOnce) NextRetry(*rivertype.JobRow) time.Time { return time.Now() }

// emailWorker sends one invoice email per job.
type emailWorker struct {
	river.WorkerDefaults[sendInvoiceEmail]
	smtp  string
	helo  string
	hooks hooks
}

func (w *emailWorker) Work(ctx context.Context, job *river.Job[sendInvoiceEmail]) error {
	a := job.Args
	if w.hooks.beforeSend != nil {
		w.hooks.beforeSend(a.EventID)
	}
	msg := fmt.Appendf(nil, "From: invoicing@shop.test\r\nTo: %s\r\nSubject: Invoice for order %s\r\nMessage-ID: %s\r\n\r\nYour invoice for order %s.\r\n",
		a.To, a.OrderID, messageID(a.EventID), a.OrderID)
	if err := sendMail(w.smtp, w.helo, "invoicing@shop.test", a.To, msg); err != nil {
		return err
	}
	if w.hooks.afterAccept != nil {
		w.hooks.afterAccept(a.EventID)
	}
	return nil
}

// sendMail sends msg with go-smtp's client and returns nil once the server
// accepted it (its 250 after DATA). What fails after the acceptance (QUIT)
// is not an error: a retry would send the email again.
func sendMail(addr, helo, from, to string, msg []byte) error {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	c := smtp.NewClient(conn)
	c.CommandTimeout, c.SubmissionTimeout = 30*time.Second, 30*time.Second
	defer c.Close()
	if err := c.Hello(helo); err != nil {
		return err
	}
	if err := c.SendMail(from, []string{to}, bytes.NewReader(msg)); err != nil {
		return err
	}
	_ = c.Quit()
	return nil
}
