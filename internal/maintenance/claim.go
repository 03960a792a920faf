package maintenance

import "context"

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
	Insert  string
	Args    func(consumer, eventID string, fingerprint []byte) ([]any, error)
	Claimed func(rowsAffected int64) (bool, error)
	// After, when not empty, runs after a new claim, before the handler.
	After string
	// Fingerprint reads the fingerprint stored with (consumer, event id),
	// with [ClaimSQL.Insert]'s parameters but the last (the fingerprint).
	Fingerprint string
	// Classify turns a driver error into one the middleware understands
	// (lock timeouts wrap inbox.ErrInFlight).
	Classify func(error) error
	// Verify checks, before the first claim, that the table is the one the
	// configuration describes.
	Verify func(ctx context.Context) error
	// TxWrites returns rows whose last columns, added up, count the rows
	// the current transaction has written, for inbox.TxWriteCounter; ""
	// when the database cannot count them.
	TxWrites string
}
