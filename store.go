package inbox

import (
	"context"
	"database/sql"
)

// Store records claims: one row per (consumer, event id), inserted in the
// transaction that also carries the handler's writes. *sqlinbox.Store
// implements it for PostgreSQL, MySQL/MariaDB and SQLite.
type Store interface {
	// Claim opens a transaction and, as its first statement, inserts the
	// (consumer, eventID) row with a conflict clause that cannot fail.
	//
	// When the row is new, Claim returns the open transaction and true: the
	// caller runs the handler in it and commits or rolls back. When the row
	// already exists (the message is a duplicate), Claim rolls its
	// transaction back itself and returns nil and false. On error the
	// transaction is already rolled back; errors that mean "retry later"
	// wrap ErrInFlight.
	Claim(ctx context.Context, opts *sql.TxOptions, consumer, eventID string) (*sql.Tx, bool, error)
}

// EventIDChecker is implemented by stores whose event id column accepts less
// than any valid string, such as a native UUID column. The middleware calls it
// before opening a transaction; the returned error should wrap
// ErrInvalidEventID. It may also return a canonical form of the id, so that
// equal ids spelled differently (upper- and lower-case UUIDs) share one row.
type EventIDChecker interface {
	CheckEventID(id string) (string, error)
}
