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
// (the lease table's SQL is in lease.go), [inboxdriver.TxWriteCounter]
// (txwrites.go), and [Store.OldestClaim], which package [prommetrics] reads.
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
var (
	_ inboxdriver.ConsumerRegistry = (*Store)(nil)
	_ inboxdriver.TxWriteCounter   = (*Store)(nil)
)

// LeaseTable returns the lease table's name: the inbox table's with the
// suffix "_leases", in the same schema. Each process claiming for a
// consumer renews a row there, so that the inbox check command can tell
// two services claiming with one consumer.
func (s *Store) LeaseTable() string { return s.table.derived(leaseSuffix).String() }

// Heartbeat implements [inboxdriver.ConsumerRegistry]: it renews h's lease
// and lists the other services with a live lease on h.Consumer. Statements
// outside any transaction, so that the list sees the leases of services
// that renewed concurrently.
func (s *Store) Heartbeat(ctx context.Context, h inboxdriver.Heartbeat) ([]string, error) {
	q := s.q.leases
	if h.First {
		if _, err := s.db.ExecContext(ctx, q.expire, h.Consumer); err != nil {
			return nil, s.leaseErr(err)
		}
	}
	if _, err := s.db.ExecContext(ctx, q.renew, h.Consumer, h.Service, h.Instance, h.Warnings); err != nil {
		return nil, s.leaseErr(err)
	}
	rows, err := s.db.QueryContext(ctx, q.others, h.Consumer, h.Service, int64(h.Lease/time.Second))
	if err != nil {
		return nil, s.leaseErr(err)
	}
	defer rows.Close()
	var others []string
	for rows.Next() {
		var service string
		if err := rows.Scan(&service); err != nil {
			return nil, s.leaseErr(err)
		}
		others = append(others, service)
	}
	if err := rows.Err(); err != nil {
		return nil, s.leaseErr(err)
	}
	return others, nil
}

// leaseErr names the lease table and what to run when it is missing.
func (s *Store) leaseErr(err error) error {
	return fmt.Errorf("sqlinbox: renewing a lease in %s (Store.CreateSchema creates it): %w", s.LeaseTable(), s.dialectErr(s.dialect.classify(err)))
}

// CountTxWrites implements [inboxdriver.TxWriteCounter] on a transaction of
// this store.
func (s *Store) CountTxWrites(ctx context.Context, tx inboxdriver.Tx) (int64, bool, error) {
	t, ok := tx.Handle().(*sql.Tx)
	d, counts := s.dialect.(txWritesDialect)
	if !ok || !counts {
		return 0, false, nil
	}
	n, ok, err := sumLastColumn(ctx, t, d.txWrites())
	if err != nil {
		return 0, false, fmt.Errorf("sqlinbox: counting the transaction's writes: %w", err)
	}
	return n, ok, nil
}

// txWritesSQL returns the statement [Store.CountTxWrites] runs, for a store
// that sends it through another driver ([maintenance.ClaimSQL]), "" when the
// dialect cannot count.
func (s *Store) txWritesSQL() string {
	if d, ok := s.dialect.(txWritesDialect); ok {
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
