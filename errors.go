package inbox

import "errors"

// Errors a caller can recognise with [errors.Is]. Each one means the handler
// did not run and nothing was written, so the message is nacked and can be
// retried or moved to a poison queue.
var (
	// ErrMissingEventID means the message carries no event id where the
	// configured [EventIDFunc] looks for one. Redelivering it cannot help:
	// route it to a poison queue and fix the producer.
	ErrMissingEventID = errors.New("inbox: message has no event id")

	// ErrInvalidEventID means the event id is empty, longer than
	// [MaxEventIDLength] bytes, not valid UTF-8, contains a NUL byte, or
	// does not fit the store's column (for example not a UUID in UUID
	// mode). The wrapping error quotes the offending id (truncated).
	ErrInvalidEventID = errors.New("inbox: invalid event id")

	// ErrNoConsumer means neither [Config.Consumer] nor the Watermill
	// handler name is set, so there is no key to scope the claim. Set
	// Config.Consumer when the middleware runs outside a router handler.
	ErrNoConsumer = errors.New("inbox: no consumer name (set inbox.Config.Consumer or run the middleware inside a router handler)")

	// ErrInFlight means another delivery of the same event is still inside
	// its transaction and the store gave up waiting for it (see the store's
	// claim timeout). The message is nacked and will be retried; by then the
	// other copy has committed (this one becomes a duplicate) or rolled back
	// (this one is processed).
	ErrInFlight = errors.New("inbox: another delivery of this event is still being processed; retry later")

	// ErrEventIDReused means the event id was already processed with another
	// fingerprint ([Config.Fingerprint]): the producer gave one id to two
	// different events. Only [IDReuseReject] returns it; redelivering
	// cannot help, so route it to a poison queue and fix the producer.
	ErrEventIDReused = errors.New("inbox: event id reused for a different event")

	// ErrStaleEvent means the event is older than [Config.MaxEventAge], so
	// its inbox row may have been purged and a duplicate of it would go
	// unnoticed. Only [StaleReject] returns it.
	ErrStaleEvent = errors.New("inbox: event is older than MaxEventAge")

	// ErrMiswired means the middleware is wired so that it cannot keep its
	// guarantee: one fixed [Config.Consumer] reached from two handler names
	// (see [Config.ShareConsumer]), the inbox applied twice to one handler,
	// [Handler] given another middleware, or a handler called twice in one
	// transaction. The wrapping error says which and what to do;
	// redelivering cannot help until the wiring is fixed.
	ErrMiswired = errors.New("inbox: middleware miswired")

	// ErrSubscriberTx means the message comes with a transaction its
	// subscriber opened (a watermill-sql subscriber's, which that package's
	// TxFromContext returns) that this middleware's transaction cannot take
	// the place of: a pgx one when the store is on database/sql
	// (a sqlinbox.Store), a database/sql one when it is on native pgx
	// (a pgxinbox.Store). The handler's writes there would commit apart from
	// the claim, so the claim is rolled back and the message refused before
	// the handler runs; the error says which subscriber setup fits.
	ErrSubscriberTx = errors.New("inbox: the message carries a subscriber's transaction this middleware cannot stand in for")

	// ErrNotInInbox is returned by [AfterCommit] when the context does not
	// come from a message handled by the inbox middleware; a handler
	// returns it when [TxFromContext] (or pgxinbox.TxFromContext) reports
	// false.
	ErrNotInInbox = errors.New("inbox: context is not inside an inbox transaction")

	// ErrTxEnded is returned by [AfterCommit] called after the handler
	// returned, from a goroutine it started or with a context kept past it:
	// the inbox transaction has already committed or rolled back, so the
	// hook would never run. Register hooks before the handler returns.
	ErrTxEnded = errors.New("inbox: the inbox transaction has already ended, so this AfterCommit hook would never run; register hooks before the handler returns")
)

// errPanicked is the Err of the observation of a handler that panicked; the
// panic itself goes on unchanged.
var errPanicked = errors.New("inbox: handler panicked")
