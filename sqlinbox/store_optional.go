package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	inbox "github.com/watermill-inbox/inbox"
)

// A [Store] implements, beside [inbox.Store], the optional interfaces the
// middleware and the metrics look for: [inbox.ConsumerRegistry] (the
// registry's SQL is in registry.go), [inbox.TxWriteCounter] (txwrites.go),
// and [Store.OldestClaim], which package [prommetrics] reads.
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
var (
	_ inbox.ConsumerRegistry = (*Store)(nil)
	_ inbox.TxWriteCounter   = (*Store)(nil)
)

// RegistryTable returns the consumer registry's name: the inbox table's
// with the suffix "_consumers", in the same schema.
func (s *Store) RegistryTable() string { return s.table.derived(registrySuffix).String() }

// RegisterConsumer implements [inbox.ConsumerRegistry]: it records service
// as consumer's owner unless another service already is, and returns the
// owner. Two statements outside any transaction, so that the second sees
// the row of a service that registered concurrently.
func (s *Store) RegisterConsumer(ctx context.Context, consumer, service string) (string, error) {
	var owner string
	_, err := s.db.ExecContext(ctx, s.q.registry.register, consumer, service)
	if err == nil {
		err = s.db.QueryRowContext(ctx, s.q.registry.owner, consumer).Scan(&owner)
	}
	if err != nil {
		return "", s.registryErr(ctx, err)
	}
	return owner, nil
}

// registryErr explains a failed registration: a missing table (created
// before the registry) by what to run, anything else as it is.
func (s *Store) registryErr(ctx context.Context, err error) error {
	md, ok := s.dialect.(maintenanceDialect)
	if !ok {
		return err
	}
	cols, cerr := columns(ctx, s.db, md.maintenanceQueries(s.table.derived(registrySuffix), s.config))
	if cerr == nil && len(cols) == 0 {
		return fmt.Errorf("%w: %s; run Store.CreateSchema, or apply the CREATE TABLE %s statement of Store.SchemaSQL (%w)", inbox.ErrNoConsumerRegistry, s.RegistryTable(), s.RegistryTable(), err)
	}
	return s.dialectErr(s.dialect.classify(err))
}

// CountTxWrites implements [inbox.TxWriteCounter] on a transaction of this
// store: the middleware calls it around the first in-transaction publish of
// each consumer, to check that [inbox.Config.ProducedPublisher] writes
// through the transaction. Through Vitess's vtgate it cannot tell (ok is
// false): vtgate answers the count from another connection.
func (s *Store) CountTxWrites(ctx context.Context, tx inbox.StoreTx) (int64, bool, error) {
	t, ok := tx.(inbox.SQLTx)
	d, counts := s.dialect.(txWritesDialect)
	if !ok || !counts || s.onVitess() {
		return 0, false, nil
	}
	n, ok, err := sumLastColumn(ctx, t.Tx, d.txWrites())
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
