package maintenance

import (
	"context"
	"sync/atomic"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// ClaimSQL is the claim of one inbox table, for a store that sends it through
// another driver ([pgxinbox.Store], on native pgx): its statements, in the
// order they run in the claim's transaction, and how to read their results.
// The SQL text is written once, in the store package, and sent as it is by
// every driver.
//
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type ClaimSQL struct {
	// Before, when not empty, runs first, with the consumer and the event
	// id, and returns one text value that [ClaimSQL.CheckBefore] judges (a
	// partitioned table's lock on the event's key).
	Before      string
	CheckBefore func(result string) error
	// Insert inserts the claim with the parameters [ClaimSQL.Args] returns.
	// It affects one row for a new claim and none for a duplicate;
	// [ClaimSQL.Claimed] reads the count.
	Insert string
	Args   func(c inboxdriver.Claim) ([]any, error)
	// OnlyIDs reports that [ClaimSQL.Insert]'s parameters are the consumer
	// and the event id alone, as [ClaimSQL.Args] would return them: a store
	// may then pass them without calling Args, saving its slice.
	OnlyIDs bool
	Claimed func(rowsAffected int64) (bool, error)
	// After, when not empty, runs after a new claim, before the handler.
	After string
	// Fingerprint reads the fingerprint stored with (consumer, event id),
	// with [ClaimSQL.Insert]'s parameters but the last (the fingerprint).
	Fingerprint string
	// Classify turns a driver error into one the middleware understands
	// (lock timeouts wrap inboxdriver.ErrInFlight).
	Classify func(error) error
	// Verify checks, before the first claim, that the table is the one the
	// configuration describes.
	Verify func(ctx context.Context) error
	// TxWrites returns rows whose last columns, added up, count the rows
	// the current transaction has written, for inboxdriver.TxWriteCounter; ""
	// when the database cannot count them.
	TxWrites string
	// TxWritesGranted, when not "", returns whether the session may run
	// TxWrites: a statement that cannot fail, so that a missing grant
	// never aborts the claim's transaction.
	TxWritesGranted string
	// Batch is the multi-row claim; its Insert is nil when the table
	// cannot be claimed in batches.
	Batch BatchSQL
}

// ConsumerArg keeps the consumer a store claims for as a statement
// argument, converted to an interface value once: the conversion of a
// string allocates, and a store claims for the same consumer on every
// message. The zero value is ready; it keeps the first consumer it is
// given and converts any other one anew each time, as without it.
type ConsumerArg struct{ first atomic.Pointer[consumerArg] }

type consumerArg struct {
	name string
	arg  any
}

// Arg returns consumer as an argument.
func (c *ConsumerArg) Arg(consumer string) any {
	if p := c.first.Load(); p != nil {
		if p.name == consumer {
			return p.arg
		}
		return consumer
	}
	p := &consumerArg{name: consumer, arg: consumer}
	c.first.CompareAndSwap(nil, p)
	return p.arg
}

// BatchSQL is a table's multi-row claim (inboxdriver.BatchClaimer), for a
// store that sends it through another driver: every statement returns the
// new ids as text.
type BatchSQL struct {
	// IDs checks a batch's ids and returns them in the form the table
	// stores (canon, in the batch's order) and sorted, the order they are
	// claimed in.
	IDs func(b inboxdriver.BatchClaim) (canon, sorted []string, err error)
	// Lock, when not nil, runs before Insert for the same ids, with the
	// same arguments, and returns one text value for ClaimSQL.CheckBefore.
	Lock func(n int) string
	// Insert claims n ids in order and returns the new ones.
	Insert func(n int) string
	Args   func(consumer string, ids []string) ([]any, error)
	// MaxRows is the most ids one statement takes.
	MaxRows int
}
