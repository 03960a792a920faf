package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// A [Store] implements, beside [inboxdriver.Store], the optional interfaces
// the middleware and the metrics look for: [inboxdriver.ConsumerRegistry]
// (lease.go), [inboxdriver.TxWriteCounter]
// (txwrites.go), and [Store.OldestClaim], which package [prommetrics] reads.
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
var (
	_ inboxdriver.ConsumerRegistry = (*Store)(nil)
	_ inboxdriver.TxWriteCounter   = (*Store)(nil)
)

// CountTxWrites implements [inboxdriver.TxWriteCounter] on a transaction of
// this store. Behind a transaction-pooling proxy it cannot tell: the server
// backend serves other clients between two transactions and flushes their
// pending statistics when it likes, so two readings in one transaction
// may differ by more than its own writes (a false publisher_outside_tx).
func (s *Store) CountTxWrites(ctx context.Context, tx inboxdriver.Tx) (int64, bool, error) {
	t, ok := tx.Handle().(*sql.Tx)
	d, counts := s.dialect.(txWritesDialect)
	if !ok || !counts || s.onVitess() || s.config.TransactionPooling {
		return 0, false, nil
	}
	if g, ok := s.dialect.(txWritesGrantDialect); ok {
		var granted bool
		if err := t.QueryRowContext(ctx, g.txWritesGranted()).Scan(&granted); err != nil {
			return 0, false, fmt.Errorf("sqlinbox: counting the transaction's writes: %w", err)
		}
		if !granted {
			return 0, false, fmt.Errorf("sqlinbox: counting the transaction's writes: %w", errTxWritesDenied)
		}
	}
	n, ok, err := sumLastColumn(ctx, t, d.txWrites())
	if err != nil {
		return 0, false, fmt.Errorf("sqlinbox: counting the transaction's writes: %w", err)
	}
	return n, ok, nil
}

// txWritesGrantedSQL returns the statement that tells whether
// [Store.CountTxWrites] may run, "" when it needs no privilege.
func (s *Store) txWritesGrantedSQL() string {
	if g, ok := s.dialect.(txWritesGrantDialect); ok {
		return g.txWritesGranted()
	}
	return ""
}

// txWritesSQL returns the statement [Store.CountTxWrites] runs, for a store
// that sends it through another driver ([maintenance.ClaimSQL]), "" when the
// dialect cannot count.
func (s *Store) txWritesSQL() string {
	if d, ok := s.dialect.(txWritesDialect); ok && !s.config.TransactionPooling {
		return d.txWrites()
	}
	return ""
}

// OldestClaim returns when the oldest row still in the table was claimed, by
// the database clock, in UTC; ok is false for an empty table. It reads one
// entry of the processed_at index (of each partition, for a partitioned
// table), so it is cheap enough for every metrics scrape. An oldest claim
// much older than the purge retention means the purge is not running.
func (s *Store) OldestClaim(ctx context.Context) (oldest time.Time, ok bool, err error) {
	var text sql.NullString
	if err := s.db.QueryRowContext(ctx, s.q.oldest).Scan(&text); err != nil {
		return time.Time{}, false, fmt.Errorf("sqlinbox: reading the oldest claim of %s: %w", s.table, s.dialect.classify(err))
	}
	if !text.Valid {
		return time.Time{}, false, nil
	}
	at, err := time.Parse(time.RFC3339Nano, text.String)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("sqlinbox: reading the oldest claim of %s: %w", s.table, err)
	}
	return at.UTC(), true, nil
}
