package inbox

import (
	"context"
	"database/sql"
)

// TxFromContext returns the transaction that holds the message's inbox claim.
// Write the handler's effects through it: they commit together with the claim
// or not at all. Call it with msg.Context() inside a handler behind the inbox
// middleware; ok is false anywhere else, and when the store is not on
// [database/sql] ([pgxinbox.TxFromContext] returns a native pgx store's
// transaction). Do not commit or roll back the transaction yourself, return an
// error from the handler instead. A handler that succeeds without calling it is
// reported once per consumer (see [TxNotNeeded]).
//
// A message from a watermill-sql subscriber (v3, v4) comes with the
// subscriber's own transaction, which watermill-sql's TxFromContext returns.
// For the handler, the middleware puts this transaction in its place, so
// both accessors return the transaction that holds the claim, and writes
// through either commit with it.
//
// Called in a handler whose store hands out another kind of transaction (a
// [*pgxinbox.Store]'s [pgx.Tx]), it returns false and logs once per
// consumer, at error level through [Config.Logger], which accessor fits the
// store.
//
// [pgxinbox.TxFromContext]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#TxFromContext
// [*pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
// [pgx.Tx]: https://pkg.go.dev/github.com/jackc/pgx/v5#Tx
func TxFromContext(ctx context.Context) (tx *sql.Tx, ok bool) {
	st, ok := StoreTxAs[SQLTx](ctx, "inbox.TxFromContext")
	return st.Tx, ok
}

// StoreTxFromContext returns the transaction that holds the message's inbox
// claim as its [Store] made it, for a store's own typed accessor (such as
// [pgxinbox.TxFromContext]); handlers call that accessor, or
// [TxFromContext]. Like them, it counts as the handler taking the
// transaction.
//
// [pgxinbox.TxFromContext]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#TxFromContext
func StoreTxFromContext(ctx context.Context) (StoreTx, bool) {
	s := sessionFrom(ctx)
	if s == nil {
		return nil, false
	}
	s.markTxTaken()
	return s.tx, true
}

// StoreTxAs returns the transaction that holds the message's inbox claim
// when it is a T, for a store's typed accessor named accessor
// ([pgxinbox.TxFromContext] is StoreTxAs[pgx.Tx](ctx,
// "pgxinbox.TxFromContext")). ok is false outside an inbox transaction, and
// when the store's transaction is not a T: a handler calling the accessor of
// another store, which is logged once per consumer at error level, naming
// the accessor that fits. Only a transaction returned counts as the handler
// taking it.
//
// [pgxinbox.TxFromContext]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#TxFromContext
func StoreTxAs[T StoreTx](ctx context.Context, accessor string) (tx T, ok bool) {
	s := sessionFrom(ctx)
	if s == nil {
		return tx, false
	}
	if tx, ok = s.tx.(T); !ok {
		s.e.reportWrongAccessor(s, accessor)
		return tx, false
	}
	s.markTxTaken()
	return tx, true
}

// TxNotNeeded declares that the handler of the message whose context is ctx
// deliberately writes nothing in SQL for it: its only effect is an
// [AfterCommit] hook, or it ignores this event. The middleware then does not
// report it for succeeding without [TxFromContext], which otherwise means
// writes that go around the claim (see [Config.Logger]). Outside an inbox
// transaction it does nothing.
func TxNotNeeded(ctx context.Context) {
	if s := sessionFrom(ctx); s != nil {
		s.markTxNotNeeded()
	}
}

// EventIDFromContext returns the event id and consumer of the message being
// handled, as the inbox recorded them.
func EventIDFromContext(ctx context.Context) (eventID, consumer string, ok bool) {
	s := sessionFrom(ctx)
	if s == nil {
		return "", "", false
	}
	return s.eventID, s.consumer, true
}

// AfterCommit registers fn to run after the inbox transaction commits, for an
// effect that cannot join the transaction (an email, an HTTP call). fn never
// runs when the handler fails, panics or the commit fails, nor for a
// duplicate. It is at most once: if the process dies between the commit and
// fn, the effect never happens, so record in the transaction what fn is about
// to do and let a sweeper compensate for effects that are missing (see the
// README). An error or a panic from fn is logged and reported in
// [Observation.AfterCommitErr]; the message is still acked because its
// transaction is committed, and the hooks after fn still run. Hooks run in
// registration order, with the message's context (cancellation removed).
//
// Register hooks before the handler returns: called later (from a goroutine
// the handler started, or with a context kept past the handler),
// AfterCommit returns [ErrTxEnded] and fn never runs.
func AfterCommit(ctx context.Context, fn func(ctx context.Context) error) error {
	s := sessionFrom(ctx)
	if s == nil {
		return ErrNotInInbox
	}
	return s.afterCommit(fn)
}
