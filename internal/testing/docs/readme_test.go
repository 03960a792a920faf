//lint:file-ignore SA4006 the README's snippets show the calls without their error checks, which the tests add between paragraphs

package docs_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

import (
	_ "github.com/jackc/pgx/v5/stdlib" // your driver (see Databases below)
	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox" // the database/sql store: PostgreSQL, MySQL/MariaDB, SQLite

	"github.com/watermill-inbox/inbox/otelinbox"   // optional: OpenTelemetry spans
	"github.com/watermill-inbox/inbox/pgxinbox"    // or the native pgx store, on a pgxpool.Pool
	"github.com/watermill-inbox/inbox/prommetrics" // optional: Prometheus metrics and alerting rules
	"github.com/watermill-inbox/inbox/purge"       // retention: delete rows once no copy can arrive
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
	err = store.CreateSchema(ctx)                                                 // idempotent; store.SchemaSQL() for migration tools
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Logger: router.Logger()})
	require.NoError(t, err)

	router.AddMiddleware(middleware.Recoverer) // any middleware, any order: all wrap the inbox
	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		tx, ok := inbox.TxFromContext(msg.Context()) // the claim and your writes commit together
		if !ok {
			return inbox.ErrNotInInbox // not behind the inbox, or pgxinbox's accessor (logged)
		}
		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, orderID) // MySQL, SQLite: ?
		return err
	}))

	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, "invoices"))
}

// The quick start on the native pgx store.
func TestREADMEPgx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := schemaDSN(t)
	p := newPipeline(t)
	router, sub, orderID := p.router, p.pubSub, "order-1"

	pool, err := pgxpool.New(ctx, dsn)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{}) // the same Config; CreateSchema, SchemaSQL, purge.New as above
	err = store.CreateSchema(ctx)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
		tx, ok := pgxinbox.TxFromContext(msg.Context()) // pgx.Tx: the claim and your writes commit together
		if !ok {
			return inbox.ErrNotInInbox // inbox.TxFromContext returns none with this store (logged)
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO invoices (order_id) VALUES ($1)`, orderID)
		return err
	}))

	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(ctx, `CREATE TABLE invoices (order_id TEXT NOT NULL)`)
	require.NoError(t, err)
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	p.deliver(t, "orders", "order-1", 3, 1, countRows(t, db, "invoices"))
}
