package inbox

import (
	"context"
	"database/sql"

	"github.com/watermill-inbox/inbox/internal/session"
)

// TxFromContext returns the transaction that holds the message's inbox claim.
// Write the handler's effects through it: they commit together with the claim
// or not at all. Call it with msg.Context() in a handler behind the inbox
// middleware; ok is false anywhere else, and behind a store on native pgx,
// whose transaction [pgxinbox.TxFromContext] returns (that mistake is logged
// once per consumer). Do not commit or roll back the transaction yourself:
// return an error from the handler instead.
//
// A message from a watermill-sql subscriber comes with the subscriber's own
// transaction, which watermill-sql's TxFromContext returns. For the handler
// the middleware puts the claim's transaction in its place, so both
// accessors return the transaction that holds the claim.
//
// [pgxinbox.TxFromContext]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#TxFromContext
func TxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	return session.As[*sql.Tx](ctx, "inbox.TxFromContext")
}

// TxNotNeeded declares that the handler of the message whose context is ctx
// deliberately writes nothing in SQL for it (its only effect is an
// [AfterCommit] hook, or it ignores the event), so that succeeding without
// [TxFromContext] is not reported. Outside an inbox transaction it does
// nothing.
func TxNotNeeded(ctx context.Context) {
	if s := session.From(ctx); s != nil {
		s.MarkTxNotNeeded()
	}
}

// EventIDFromContext returns the event id and consumer of the message being
// handled, as the inbox recorded them.
func EventIDFromContext(ctx context.Context) (eventID, consumer string, ok bool) {
	s := session.From(ctx)
	if s == nil {
		return "", "", false
	}
	return s.EventID, s.Consumer, true
}

// AfterCommit registers fn to run after the inbox transaction commits, for an
// effect that cannot join the transaction (an email, an HTTP call). fn never
// runs when the handler fails or panics, when the commit fails, or for a
// duplicate. It is at most once: if the process dies between the commit and
// fn, the effect never happens, so record in the transaction what fn is about
// to do and let a sweeper compensate (see docs/outbox.md). A failing or
// panicking fn is logged and reported in the observation's AfterCommitErr;
// the message is still acked, and the hooks after it still run. Hooks run in
// registration order, with the message's context (cancellation removed).
//
// Register hooks before the handler returns: later (from a goroutine the
// handler started), AfterCommit returns [ErrTxEnded] and fn never runs.
func AfterCommit(ctx context.Context, fn func(ctx context.Context) error) error {
	s := session.From(ctx)
	if s == nil {
		return ErrNotInInbox
	}
	if !s.AfterCommit(fn) {
		return ErrTxEnded
	}
	return nil
}
