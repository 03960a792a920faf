// Package pgxinbox keeps the inbox's claims in PostgreSQL through pgx used
// natively ([pgx] and [pgxpool]) rather than through [database/sql]. Its
// [Store] goes to [inbox.NewMiddleware] like any store and keeps every
// guarantee of the database/sql one ([sqlinbox.Store]), at no extra round
// trip: BEGIN and the claim travel to PostgreSQL together.
//
//	pool, err := pgxpool.New(ctx, dsn)
//	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{})
//	err = store.CreateSchema(ctx)
//	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
//	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, handle))
//
// and in the handler:
//
//	tx, ok := pgxinbox.TxFromContext(msg.Context())
//	if !ok {
//		return inbox.ErrNotInInbox // inbox.TxFromContext here, or this one behind sqlinbox, is logged
//	}
//	_, err := tx.Exec(msg.Context(), `INSERT INTO invoices ...`)
//
// For an outbox in the same transaction, give watermill-sql v4 the
// transaction: wsql.NewPublisher(wsql.TxFromPgx(tx), ...). A message from a
// watermill-sql v4 subscriber built on pgx (wsql.BeginnerFromPgx) gets this
// transaction in the place of the subscriber's, as [inbox.TxFromContext]
// describes for database/sql.
package pgxinbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/session"
)

// TxFromContext returns the pgx transaction that holds the message's inbox
// claim; write the handler's effects through it. ok is false outside a
// handler behind the inbox middleware, and when the store is not a [Store].
// Do not commit or roll back the transaction yourself, return an error from
// the handler instead. Called behind a database/sql store (a
// [*sqlinbox.Store]), it returns false and logs once per consumer, at error
// level through [inbox.Config.Logger], that [inbox.TxFromContext] fits.
func TxFromContext(ctx context.Context) (tx pgx.Tx, ok bool) {
	return session.As[pgx.Tx](ctx, "pgxinbox.TxFromContext")
}

// PublishInTx returns the inbox.Config.ProducedPublisher of a [Store]:
// build makes, for each message, a publisher that writes through tx, the
// transaction of the message's claim (watermill-sql v4:
// sql.NewPublisher(sql.TxFromPgx(tx), ...)). The messages then commit with
// the claim and the handler's effect.
func PublishInTx(build func(tx pgx.Tx) (message.Publisher, error)) inboxdriver.TxPublisher {
	return pgxPublisher(build)
}

type pgxPublisher func(tx pgx.Tx) (message.Publisher, error)

func (b pgxPublisher) PublisherFor(tx inboxdriver.Tx) (message.Publisher, error) {
	t, ok := tx.Handle().(pgx.Tx)
	if !ok {
		return nil, fmt.Errorf("%w: pgxinbox.PublishInTx needs a pgx.Tx, and this store hands out a %T: use inbox.PublishInTx", inbox.ErrMiswired, tx.Handle())
	}
	return b(t)
}
