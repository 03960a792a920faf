package inboxdriver

import (
	"context"
	"database/sql"
	"errors"
)

// Store records claims: one row per (consumer, event id), inserted by the
// first statement of the transaction that also carries the handler's writes.
type Store interface {
	// Claim begins a transaction with c.TxOptions and, as its first
	// statement, inserts the claim with a conflict clause that cannot fail.
	//
	// For a new claim it returns the open transaction: the middleware runs
	// the handler in it, then commits or rolls back. For a duplicate it
	// rolls its transaction back itself and returns a nil [Tx] and, when
	// c.Fingerprint is not nil, the fingerprint stored with the original
	// (nil for none). On error the transaction is already rolled back;
	// errors that mean "retry later" wrap [ErrInFlight].
	Claim(ctx context.Context, c Claim) (tx Tx, stored []byte, err error)
}

// Claim is one claim the middleware asks a [Store] for.
type Claim struct {
	TxOptions *sql.TxOptions
	Consumer  string
	EventID   string
	// Fingerprint is stored with the claim when not nil (see
	// [FingerprintChecker]).
	Fingerprint []byte
	// ShardKey places the claim on the shard of the handler's own writes,
	// for a store whose table is sharded by it; "" when the middleware has
	// none.
	ShardKey string
}

// Tx is the transaction of a new claim.
type Tx interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
	// Handle returns what the handler writes through: a [*sql.Tx], or a
	// pgx.Tx for a store on native pgx.
	Handle() any
}

// ErrInFlight means another delivery of the same event is still inside its
// transaction, or won a race against this one that the database reported
// as a conflict: retry later.
var ErrInFlight = errors.New("inbox: another delivery of this event is still being processed; retry later")

// ErrBatchTooLarge means the database refused a batch claim for its size
// (a lock table, memory or packet limit): claim it in smaller parts.
var ErrBatchTooLarge = errors.New("inbox: the database cannot claim a batch this large in one transaction")
