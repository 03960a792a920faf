package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/textproto"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"

	inbox "github.com/watermill-inbox/inbox"
)

// The two ways to send an email for each invoice, side by side. Both write
// the invoice in the inbox transaction; neither sends from the handler,
// whose transaction may still roll back, nor only after the commit, which a
// crash can skip.
const (
	// viaQueue inserts a River job in the inbox transaction; River's workers
	// send the email, with River's retries and its rescue of jobs whose
	// worker died.
	viaQueue = "queue"
	// viaSweeper leaves the invoice marked unsent; a sweeper sends the
	// invoices still unsent, round after round.
	viaSweeper = "sweeper"
)

// River's timings, short so that a run takes seconds; production keeps
// River's defaults (a job times out after a minute, and a job still running
// after an hour is taken for stuck). RescueStuckJobsAfter is how long a job
// whose worker died waits before River works it again.
const (
	jobTimeout           = 5 * time.Second
	rescueStuckJobsAfter = 5 * time.Second
)

// order is what the orders service publishes.
type order struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// sendInvoiceEmail is the job the handler inserts with the invoice. The
// event id names the invoice and is the email's idempotency key.
type sendInvoiceEmail struct {
	EventID string `json:"event_id"`
}

func (sendInvoiceEmail) Kind() string { return "send_invoice_email" }

// db is the service's database: SQLite or PostgreSQL, through database/sql,
// with River's driver for it.
type db struct {
	*sql.DB
	river  riverdriver.Driver[*sql.Tx] // riversqlite or riverdatabasesql
	schema string                      // PostgreSQL: this run's schema; SQLite: none
}

// table qualifies a table name with the run's schema.
func (d db) table(name string) string {
	if d.schema == "" {
		return name
	}
	return d.schema + "." + name
}

// service is one process of the invoicing service: the handlers of both
// variants, and what sends their emails.
type service struct {
	db   db
	name string // the process's name, given to the mail server in EHLO
	mail string // the mail server's address
	jobs *river.Client[*sql.Tx]
	// accepted, when set, runs once the mail server accepted an email and
	// before the sender records it: where -kill kills a sender.
	accepted func(messageID string)
}

// newService makes the River client: with workers, which send the
// queue's emails once it is started; insert-only until then.
func newService(d db, name, mailAddr string, leader bool) (*service, error) {
	s := &service{db: d, name: name, mail: mailAddr}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, job *river.Job[sendInvoiceEmail]) error {
		return s.emailInvoice(ctx, viaQueue, job.Args.EventID)
	}))
	var err error
	s.jobs, err = river.NewClient(d.river, &river.Config{
		Schema:               d.schema,
		Queues:               map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
		Workers:              workers,
		FetchPollInterval:    200 * time.Millisecond,
		JobTimeout:           jobTimeout,
		RescueStuckJobsAfter: rescueStuckJobsAfter,
		// The leader runs River's maintenance, the rescue of stuck jobs
		// among it. A sender started for -kill leaves it to the service: a
		// leader killed keeps the leadership for its TTL (15 s).
		LeaderElectionDisabled: !leader,
		Logger:                 quietLogger,
	})
	return s, err
}

// invoiceAndQueueEmail is the job-queue variant's handler: the invoice and
// the job that will email it commit with the inbox claim, or not at all.
func (s *service) invoiceAndQueueEmail(msg *message.Message) error {
	tx, eventID, err := s.writeInvoice(msg, viaQueue)
	if err != nil {
		return err
	}
	_, err = s.jobs.InsertTx(msg.Context(), tx, sendInvoiceEmail{EventID: eventID}, nil)
	return err
}

// invoiceForSweeper is the sweeper variant's handler: the unsent invoice is
// the record the sweeper finds.
func (s *service) invoiceForSweeper(msg *message.Message) error {
	_, _, err := s.writeInvoice(msg, viaSweeper)
	return err
}

// writeInvoice renders the order's invoice and writes it in the inbox
// transaction, with its email not sent yet.
func (s *service) writeInvoice(msg *message.Message, via string) (*sql.Tx, string, error) {
	ctx := msg.Context()
	tx, ok := inbox.TxFromContext(ctx)
	if !ok {
		return nil, "", errors.New("no inbox transaction: is the handler behind the inbox middleware?")
	}
	eventID, _, _ := inbox.EventIDFromContext(ctx)
	var o order
	if err := json.Unmarshal(msg.Payload, &o); err != nil {
		return nil, "", fmt.Errorf("order %s: %w", eventID, err)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO `+s.db.table("invoices")+` (via, event_id, order_id, customer, amount_cents, pdf)
		VALUES ($1, $2, $3, $4, $5, $6)`, via, eventID, o.ID, o.Customer, o.AmountCents, renderPDF(o, eventID))
	return tx, eventID, err
}

// emailInvoice sends the email of one invoice and records it sent. The
// email can leave and the record fail (a crash in between): the next
// attempt sends it again, with the same Message-ID.
func (s *service) emailInvoice(ctx context.Context, via, eventID string) error {
	var o order
	var pdf string
	err := s.db.QueryRowContext(ctx, `SELECT order_id, customer, amount_cents, pdf FROM `+s.db.table("invoices")+`
		WHERE via = $1 AND event_id = $2`, via, eventID).Scan(&o.ID, &o.Customer, &o.AmountCents, &pdf)
	if err != nil {
		return fmt.Errorf("reading the invoice of %s: %w", eventID, err)
	}
	id := messageID(via, eventID)
	if err := sendMail(s.mail, s.name, sender(via), o.Customer, invoiceEmail(id, o, pdf)); err != nil {
		return err
	}
	if s.accepted != nil {
		s.accepted(id)
	}
	// Out is out: record it even if the job's time ran out meanwhile, or
	// River would retry it and send it again.
	_, err = s.db.ExecContext(context.WithoutCancel(ctx), `UPDATE `+s.db.table("invoices")+` SET email_sent_ms = $1 WHERE via = $2 AND event_id = $3`,
		time.Now().UnixMilli(), via, eventID)
	return err
}

// sweep sends the email of every invoice of the sweeper variant still
// unsent. One sweeper at a time: two would send the same email twice (with
// several instances, run it on one, or as a River periodic job, which only
// River's leader runs). An email that fails waits for the next round.
func (s *service) sweep(ctx context.Context) error {
	rows, err := s.db.QueryContext(ctx, `SELECT event_id FROM `+s.db.table("invoices")+` WHERE via = $1 AND email_sent_ms IS NULL`, viaSweeper)
	if err != nil {
		return err
	}
	var unsent []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		unsent = append(unsent, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, id := range unsent {
		// A temporary failure (SMTP 4xx) is for the next round; another
		// one too, but it may need a look.
		var smtpErr *textproto.Error
		if err := s.emailInvoice(ctx, viaSweeper, id); err != nil && !(errors.As(err, &smtpErr) && smtpErr.Code/100 == 4) {
			log.Printf("sweeper: %v (next round)", err)
		}
	}
	return nil
}

// runSweeper sweeps every interval until ctx is done.
func (s *service) runSweeper(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.sweep(ctx); err != nil && ctx.Err() == nil {
			log.Printf("sweeper: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// renderPDF stands for the invoice's PDF rendering.
func renderPDF(o order, eventID string) string {
	return fmt.Sprintf("%%PDF-1.4\n%% stand-in for a rendered invoice\n(Invoice for order %s) (%s) (%d.%02d EUR) (ref %s)\n%%%%EOF\n",
		o.ID, o.Customer, o.AmountCents/100, o.AmountCents%100, eventID)
}
