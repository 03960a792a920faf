//lint:file-ignore SA4006 the README's snippets show the calls without their error checks, which the tests add between paragraphs

package docs_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	_ "github.com/jackc/pgx/v5/stdlib" // your driver; sqlinbox links none
	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox" // database/sql: PostgreSQL, MySQL/MariaDB, SQLite

	"github.com/watermill-inbox/inbox/otelinbox"   // OpenTelemetry spans
	"github.com/watermill-inbox/inbox/pgxinbox"    // or native pgx, on a pgxpool.Pool
	"github.com/watermill-inbox/inbox/prommetrics" // Prometheus metrics and alerts
	"github.com/watermill-inbox/inbox/purge"       // retention
)

// The README's other imports, shown in docs/retention.md and docs/operations.md.
var _, _, _ = purge.New, prommetrics.New, otelinbox.New

// The quick start: three copies of one event, one invoice.
func TestREADMEQuickStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	p := newPipeline(t)
	router, sub, orderID := p.router, p.pubSub, "order-1"

	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL}) // or MySQL, SQLite
	err = store.CreateSchema(ctx)                                                 // idempotent; SchemaSQL() for migration tools
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Logger: router.Logger()})
	require.NoError(t, err)

	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context()) // the claim and your writes commit together
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, orderID)
		return err
	}))

	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, "invoices"))
}

// The recommended stack: a handler that fails twice, then succeeds, is
// retried within the delivery and commits once; nothing is poisoned.
func TestREADMEStack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("pgx", schemaDSN(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	require.NoError(t, err)
	p := newPipeline(t)
	router, sub, pub, logger := p.router, p.pubSub, p.pubSub, watermill.NopLogger{}
	var attempts atomic.Int32
	handle := func(msg *message.Message) error {
		if attempts.Add(1) < 3 {
			return errors.New("the payment service is down")
		}
		tx, ok := inbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES ('order-1')`)
		return err
	}

	poison, err := middleware.PoisonQueueWithFilter(pub, "poison", func(err error) bool { return !inbox.IsTransient(err) })
	backoff, err := inbox.NewBackoff(inbox.BackoffConfig{}, logger)
	router.AddMiddleware(
		poison, // a missing event id, a miswiring, inbox.Permanent: at once; a handler's error: after the retries
		middleware.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond,
			ShouldRetry: func(p middleware.RetryParams) bool { return !inbox.IsPermanent(p.Err) }}.Middleware,
		middleware.Recoverer, // inside Retry: a panic is retried like an error
		backoff,              // the database down: waited out in place, one log line per 10 s, never poisoned
	)
	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, handle))

	require.NoError(t, err)
	poisoned, err := sub.Subscribe(ctx, "poison")
	require.NoError(t, err)
	p.deliver(t, "orders", "order-1", 1, 1, countRows(t, db, "invoices"))
	require.Equal(t, int32(3), attempts.Load())
	select {
	case m := <-poisoned:
		t.Fatalf("poisoned: %s", m.Metadata)
	case <-time.After(100 * time.Millisecond):
	}
}

// The quick start on the native pgx store.
func TestREADMEPgx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := schemaDSN(t)
	p := newPipeline(t)
	router, sub, orderID := p.router, p.pubSub, "order-1"
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE invoices (order_id TEXT NOT NULL)`)
	require.NoError(t, err)

	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{}) // the same Config
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		tx, ok := pgxinbox.TxFromContext(msg.Context())
		if !ok {
			return inbox.ErrNotInInbox
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, orderID)
		return err
	}))

	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, "invoices"))
}
