package sqlinbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// PgxStore records inbox claims in PostgreSQL through a pgx connection pool,
// without database/sql. Its claim sends BEGIN and the claim's INSERT to the
// server together, in one round trip, where database/sql spends one on BEGIN
// and one on the INSERT: behind the inbox a handler then makes exactly as
// many round trips as without it. Use it with pgxinbox.NewMiddleware.
//
// The embedded *Store runs everything else (CreateSchema, SchemaSQL, the
// purge) through database/sql on connections of the same pool.
type PgxStore struct {
	*Store
	pool *pgxpool.Pool

	mu       sync.Mutex  // serialises the layout check
	verified atomic.Bool // set by the first claim that succeeds
}

// NewPgx returns a PgxStore for pool. config.Dialect defaults to
// PostgreSQL, the only dialect pgx speaks. Closing the store does not close
// the pool.
func NewPgx(pool *pgxpool.Pool, config Config) (*PgxStore, error) {
	if pool == nil {
		return nil, errors.New("sqlinbox: invalid config: pool is nil")
	}
	if config.Dialect == nil {
		config.Dialect = PostgreSQL
	}
	if config.Dialect != PostgreSQL {
		return nil, fmt.Errorf("sqlinbox: invalid config: NewPgx needs the PostgreSQL dialect, not %s", config.Dialect)
	}
	s, err := New(stdlib.OpenDBFromPool(pool), config)
	if err != nil {
		return nil, err
	}
	return &PgxStore{Store: s, pool: pool}, nil
}

// Pool returns the pool the store claims on.
func (s *PgxStore) Pool() *pgxpool.Pool { return s.pool }

// Claim opens a transaction on a pooled connection and claims (consumer,
// eventID) in it, in one round trip: BEGIN and the INSERT are pipelined,
// with the event's lock between them on a partitioned table. Its contract
// is inbox.Store's: the open transaction and true for a new claim; for a
// duplicate or an error the transaction is already rolled back and its
// connection back in the pool.
func (s *PgxStore) Claim(ctx context.Context, opts pgx.TxOptions, consumer, eventID string) (pgx.Tx, bool, error) {
	tx, claimed, _, err := s.claim(ctx, opts, consumer, eventID, nil, false)
	return tx, claimed, err
}

// ClaimWithFingerprint is Claim, storing fingerprint (nil: NULL) with a new
// claim, as Store.ClaimWithFingerprint does on database/sql. For a
// duplicate with a fingerprint it reads the original's in the claim's
// transaction, one more round trip, then rolls back; a new claim costs
// nothing more.
func (s *PgxStore) ClaimWithFingerprint(ctx context.Context, opts pgx.TxOptions, consumer, eventID string, fingerprint []byte) (pgx.Tx, bool, []byte, error) {
	if err := s.CheckFingerprints(); err != nil {
		return nil, false, nil, err
	}
	return s.claim(ctx, opts, consumer, eventID, fingerprint, fingerprint != nil)
}

// claim is Claim, reading the stored fingerprint of a duplicate when
// readFingerprint is set.
func (s *PgxStore) claim(ctx context.Context, opts pgx.TxOptions, consumer, eventID string, fingerprint []byte, readFingerprint bool) (pgx.Tx, bool, []byte, error) {
	if !s.verified.Load() {
		if err := s.verify(ctx); err != nil {
			return nil, false, nil, err
		}
	}
	// BEGIN is part of the batch, never sent apart from it: a claim sent
	// without BEGIN would commit on its own, and a failing handler would
	// then leave the event marked as processed.
	b := &pgx.Batch{}
	b.BeginTx(opts)
	if s.q.beforeClaim != "" {
		b.Queue(s.q.beforeClaim, consumer, eventID)
	}
	if s.config.Fingerprints {
		b.Queue(s.q.claim, consumer, eventID, fingerprint)
	} else {
		b.Queue(s.q.claim, consumer, eventID)
	}
	if s.q.afterClaim != "" {
		b.Queue(s.q.afterClaim)
	}
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	claimed, err := s.readClaim(br)
	// Close before the transaction is used: the connection carries the
	// batch until then. A failed statement has aborted the transaction,
	// which only a rollback ends.
	if cerr := br.Close(); err == nil && cerr != nil {
		err = s.dialect.classify(cerr)
	}
	if err == nil && !s.verified.Load() {
		s.verified.Store(true)
	}
	if err == nil && claimed {
		return tx, true, nil, nil
	}
	var stored []byte
	if err == nil && readFingerprint {
		// Under READ COMMITTED this statement sees the committed row the
		// claim found; under REPEATABLE READ the claim saw only rows of
		// its snapshot, which this one shares.
		err = tx.QueryRow(ctx, s.q.fingerprint, consumer, eventID).Scan(&stored)
		if errors.Is(err, pgx.ErrNoRows) { // purged meanwhile
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("sqlinbox: reading the fingerprint of a duplicate: %w", s.dialect.classify(err))
		}
	}
	// Rollback also hands the connection back to the pool; when BEGIN
	// itself failed the transaction is already closed and this only
	// releases the connection.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if err != nil {
		return nil, false, nil, err
	}
	return nil, false, stored, nil
}

func (s *PgxStore) readClaim(br pgx.BatchResults) (bool, error) {
	if _, err := br.Exec(); err != nil { // BEGIN
		return false, s.dialect.classify(err)
	}
	if s.q.beforeClaim != "" {
		var result string
		if err := br.QueryRow().Scan(&result); err != nil {
			return false, s.dialect.classify(err)
		}
		// The claim already ran; failing here rolls it back.
		if err := s.q.checkBeforeClaim(result); err != nil {
			return false, err
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return false, s.dialect.classify(err)
	}
	if claimed, err := s.claimed(tag.RowsAffected()); !claimed {
		return false, err
	}
	if s.q.afterClaim != "" {
		if _, err := br.Exec(); err != nil {
			return false, s.dialect.classify(err)
		}
	}
	return true, nil
}

// verify runs the dialect's check of the table until a claim succeeds, so
// that a store created before its table checks the table once it exists.
func (s *PgxStore) verify(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.verified.Load() || s.q.verify == nil {
		return nil
	}
	return s.q.verify(ctx, s.db, s.q)
}

// Close releases the database/sql handle the embedded Store uses; the pool
// stays open.
func (s *PgxStore) Close() error {
	return errors.Join(s.Store.Close(), s.db.Close())
}

// claimed reads the claim's affected rows: 1 for a new claim, 0 for a
// duplicate, anything else for a table that is not an inbox.
func (s *Store) claimed(n int64) (bool, error) {
	switch n {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("sqlinbox: claim affected %d rows, want 0 or 1; is %s really the inbox table?", n, s.table)
}
