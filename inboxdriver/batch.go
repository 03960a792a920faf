package inboxdriver

import (
	"context"
	"database/sql"
)

// BatchClaimer is implemented by stores that claim many events in one
// transaction with one multi-row statement, for [inbox.BatchConsumer]. A
// store without it cannot serve batch consumers.
//
// [inbox.BatchConsumer]: https://pkg.go.dev/github.com/watermill-inbox/inbox#BatchConsumer
type BatchClaimer interface {
	// ClaimBatch begins a transaction with b.TxOptions and, as its first
	// statements, claims (b.Consumer, id) for every id of b.EventIDs, in
	// ascending byte order of the ids whatever their order in b.EventIDs:
	// two batches racing on overlapping events wait for each other in one
	// order, so they cannot deadlock. claimed[i] reports that b.EventIDs[i]
	// is new.
	//
	// When at least one is new it returns the open transaction, which the
	// caller commits or rolls back. When none is, it rolls back itself and
	// returns a nil [Tx]. On error the transaction is already rolled back;
	// errors that mean "retry later" wrap [ErrInFlight]. The ids must be
	// distinct and valid ([ValidateEventID], the store's
	// [EventIDChecker]); claims store no fingerprint.
	ClaimBatch(ctx context.Context, b BatchClaim) (tx Tx, claimed []bool, err error)
}

// BatchClaim is one batch of claims a [BatchClaimer] is asked for.
type BatchClaim struct {
	TxOptions *sql.TxOptions
	Consumer  string
	EventIDs  []string
}
