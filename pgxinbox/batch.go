package pgxinbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

var _ inboxdriver.BatchClaimer = (*Store)(nil)

// ClaimBatch implements [inboxdriver.BatchClaimer] in one round trip: BEGIN,
// the events' locks on a table partitioned by processed_at, and the
// multi-row claims of [sqlinbox.Store.ClaimBatch] are pipelined, the ids in
// ascending byte order. For a batch of duplicates or an error the
// transaction is already rolled back and its connection back in the pool.
func (s *Store) ClaimBatch(ctx context.Context, b inboxdriver.BatchClaim) (inboxdriver.Tx, []bool, error) {
	bs := &s.claim.Batch
	if bs.Insert == nil {
		return nil, nil, errors.New("pgxinbox: this table cannot be claimed in batches (a shard key column)")
	}
	canon, sorted, err := bs.IDs(b)
	if err != nil {
		return nil, nil, err
	}
	txOpts, err := txOptions(b.TxOptions)
	if err != nil {
		return nil, nil, err
	}
	if !s.verified.Load() {
		if err := s.verify(ctx); err != nil {
			return nil, nil, err
		}
	}
	batch := &pgx.Batch{}
	batch.BeginTx(txOpts)
	for chunk := range slices.Chunk(sorted, bs.MaxRows) {
		args, err := bs.Args(b.Consumer, chunk)
		if err != nil {
			return nil, nil, err
		}
		if bs.Lock != nil {
			batch.Queue(bs.Lock(len(chunk)), args...)
		}
		batch.Queue(bs.Insert(len(chunk)), args...)
	}
	if s.claim.After != "" {
		batch.Queue(s.claim.After)
	}
	ticket, err := s.gate.Enter(ctx, s.poolSize)
	if err != nil {
		return nil, nil, fmt.Errorf("pgxinbox: waiting for a connection the other claims leave free: %w", err)
	}
	br := s.pool.SendBatch(ctx, batch)
	tx := br.Tx()
	fresh, err := s.readBatch(br, len(sorted))
	if cerr := br.Close(); err == nil && cerr != nil {
		err = s.claim.Classify(cerr)
	}
	claimed := make([]bool, len(canon))
	if err == nil && len(fresh) > 0 {
		s.verified.Store(true)
		for i, id := range canon {
			claimed[i] = fresh[id]
		}
		return &claimTx{tx: tx, ticket: ticket}, claimed, nil
	}
	_ = tx.Rollback(context.WithoutCancel(ctx))
	ticket.Leave()
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "53200" && len(sorted) > 1 {
		// Out of shared memory: the lock table, a lock per event on a
		// partitioned table.
		err = fmt.Errorf("%w: %d events: %w", inboxdriver.ErrBatchTooLarge, len(sorted), err)
	}
	if err != nil {
		return nil, nil, err
	}
	return nil, claimed, nil
}

// readBatch reads the results of the batch ClaimBatch sent: the new ids.
func (s *Store) readBatch(br pgx.BatchResults, n int) (map[string]bool, error) {
	c, bs := &s.claim, &s.claim.Batch
	if _, err := br.Exec(); err != nil { // BEGIN
		return nil, c.Classify(err)
	}
	fresh := make(map[string]bool, n)
	for range (n + bs.MaxRows - 1) / bs.MaxRows {
		if bs.Lock != nil {
			var result string
			if err := br.QueryRow().Scan(&result); err != nil {
				return nil, c.Classify(err)
			}
			if err := c.CheckBefore(result); err != nil {
				return nil, err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return nil, c.Classify(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, c.Classify(err)
			}
			fresh[id] = true
		}
		if rows.Close(); rows.Err() != nil {
			return nil, c.Classify(rows.Err())
		}
	}
	if c.After != "" && len(fresh) > 0 {
		if _, err := br.Exec(); err != nil {
			return nil, c.Classify(err)
		}
	}
	return fresh, nil
}
