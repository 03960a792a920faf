package inbox

import (
	"context"
	"database/sql"
)

// Store records claims: one row per (consumer, event id), inserted by the
// first statement of the transaction that also carries the handler's writes.
// [sqlinbox.Store] implements it on [database/sql] (PostgreSQL, MySQL/MariaDB,
// SQLite) and [pgxinbox.Store] on native pgx; [NewMiddleware] takes either.
//
// [sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type Store interface {
	// Claim begins a transaction with opts and, as its first statement,
	// inserts (consumer, eventID) with a conflict clause that cannot fail,
	// storing fingerprint with the row when it is not nil.
	//
	// For a new claim it returns the open transaction: the middleware runs
	// the handler in it, then commits or rolls back. For a duplicate it
	// rolls its transaction back itself and returns a nil [StoreTx] and,
	// when fingerprint is not nil, the fingerprint stored with the original
	// (nil for none). On error the transaction is already rolled back;
	// errors that mean "retry later" wrap [ErrInFlight].
	Claim(ctx context.Context, opts *sql.TxOptions, consumer, eventID string, fingerprint []byte) (tx StoreTx, stored []byte, err error)
}

// StoreTx is the transaction of a new claim, as its store made it: a [pgx.Tx]
// for [pgxinbox.Store], an [SQLTx] for stores on [database/sql].
//
// [pgx.Tx]: https://pkg.go.dev/github.com/jackc/pgx/v5#Tx
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type StoreTx interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// SQLTx is a [*sql.Tx] as a [StoreTx], for stores on [database/sql]:
// [TxFromContext] hands the handler the *sql.Tx inside. Its [SQLTx.Commit] and
// [SQLTx.Rollback] take a context, which database/sql's do not use.
type SQLTx struct{ *sql.Tx }

// Commit commits the transaction.
func (t SQLTx) Commit(context.Context) error { return t.Tx.Commit() }

// Rollback rolls the transaction back.
func (t SQLTx) Rollback(context.Context) error { return t.Tx.Rollback() }

// native returns what a handler writes through: the [*sql.Tx] inside an
// [SQLTx], else the store's transaction itself.
func native(tx StoreTx) any {
	if t, ok := tx.(SQLTx); ok {
		return t.Tx
	}
	return tx
}

// EventIDChecker is implemented by stores whose event id column accepts less
// than any valid string, such as a native UUID column. The middleware calls it
// before opening a transaction; the returned error should wrap
// [ErrInvalidEventID]. It may also return a canonical form of the id, so that
// equal ids spelled differently (upper- and lower-case UUIDs) share one row.
type EventIDChecker interface {
	CheckEventID(id string) (string, error)
}

// FingerprintChecker is implemented by stores that can keep a fingerprint
// with each claim ([Config.Fingerprint]). [NewMiddleware] refuses to start
// with a fingerprint function when the store does not implement it, or when
// [FingerprintChecker.CheckFingerprints] returns an error (a table configured
// without the column).
type FingerprintChecker interface {
	CheckFingerprints() error
}
