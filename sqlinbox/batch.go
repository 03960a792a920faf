package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/internal/maintenance"
)

var _ inboxdriver.BatchClaimer = (*Store)(nil)

// batchQueries is a dialect's multi-row claim, built for n events at a
// time: the statement text depends on n.
type batchQueries struct {
	// lock, when set, runs first, as beforeClaim does for one event: the
	// locks on the events' keys, taken in the order of the ids, on a
	// table partitioned by processed_at. It returns what
	// queries.checkBeforeClaim judges.
	lock func(n int) string
	// insert claims n events in the order of its arguments. With
	// returning it returns one row per new claim, the event id as text in
	// the form the store was given; without, its affected rows count the
	// new claims (MySQL).
	insert    func(n int) string
	returning bool
	// args are the parameters of lock and insert for the consumer and the
	// ids, in that order.
	args func(consumer string, ids []string) ([]any, error)
	// serialize, when set, takes a lock on the consumer's batch claims,
	// with the consumer as parameter, returning 1 once taken; release
	// gives it back after the claim statements (MySQL, whose gap locks
	// let sorted multi-row inserts deadlock).
	serialize, release string
}

// batchDialect is implemented by the dialects that claim in batches.
type batchDialect interface {
	batchQueries(t tableName, c Config, q queries) batchQueries
}

// maxBatchRows bounds one statement's rows: every database takes this
// many parameters (MySQL's and PostgreSQL's limit is 65,535, SQLite's
// 32,766). A larger batch is claimed by several statements, in order.
const maxBatchRows = 1000

// errBatchShardKey refuses batch claims on a table sharded by a key: a
// batch holds events of several shards.
var errBatchShardKey = errors.New("sqlinbox: batch claims are not supported on a table with a shard key column (Config.ShardKeyColumn): a batch spans shards")

// ClaimBatch implements [inboxdriver.BatchClaimer]: BEGIN, then the ids in
// ascending byte order, up to 1,000 rows per INSERT statement (PostgreSQL and
// SQLite: ON CONFLICT DO NOTHING RETURNING the new ids; MySQL: the claim's ON
// DUPLICATE KEY UPDATE, whose affected rows count the new ones, and one
// claim per id in a new transaction when the count says the batch is mixed).
// On a table partitioned by processed_at the events' locks come first, in the
// same order, as for one claim: one advisory lock per event, held until the
// transaction ends, in a lock table of max_locks_per_transaction times
// max_connections entries, which large concurrent batches can fill. Batches take their place in the store's pool
// gate as single claims do, and store no fingerprint.
func (s *Store) ClaimBatch(ctx context.Context, b inboxdriver.BatchClaim) (inboxdriver.Tx, []bool, error) {
	canon, sorted, err := s.batchIDs(b)
	if err != nil {
		return nil, nil, err
	}
	if !s.verified.Load() {
		if err := s.verify(ctx); err != nil {
			return nil, nil, err
		}
	}
	ticket, err := s.gate.Enter(ctx, s.poolSize)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlinbox: waiting for a connection the other claims leave free: %w", err)
	}
	tx, fresh, err := s.beginBatch(ctx, b, sorted)
	if err != nil && len(sorted) > 1 && tooLarge(err) {
		err = fmt.Errorf("%w: %d events: %w", inboxdriver.ErrBatchTooLarge, len(sorted), err)
	}
	if err != nil || len(fresh) == 0 {
		if tx != nil {
			_ = tx.Rollback()
		}
		ticket.Leave()
		return nil, make([]bool, len(b.EventIDs)), err
	}
	s.verified.Store(true)
	claimed := make([]bool, len(b.EventIDs))
	for i, id := range canon {
		claimed[i] = fresh[id]
	}
	t := &claimTx{tx: tx, ticket: ticket}
	s.watchPoolOfOne(t)
	return t, claimed, nil
}

// tooLarge tells a limit the database reports for a batch's size:
// PostgreSQL's lock table or memory full (53200, out of shared memory: a
// lock per event on a partitioned table), MySQL's max_allowed_packet or
// lock table.
func tooLarge(err error) bool {
	if n, ok := mysqlErrorNumber(err); ok {
		return n == mysqlPacketTooLarge || n == mysqlLockTableFull
	}
	return pgCode(err) == "53200"
}

// batchSQL is the multi-row claim for a store on another driver, nil
// where the dialect does not return the new ids.
func (s *Store) batchSQL() maintenance.BatchSQL {
	bq := s.q.batch
	if !bq.returning || s.config.ShardKeyColumn != "" {
		return maintenance.BatchSQL{}
	}
	return maintenance.BatchSQL{IDs: s.batchIDs, Lock: bq.lock, Insert: bq.insert, Args: bq.args, MaxRows: maxBatchRows}
}

// batchIDs checks a batch's ids as [Store.CheckEventID] does and returns
// them in the form the table stores (canon, in the batch's order) and
// sorted.
func (s *Store) batchIDs(b inboxdriver.BatchClaim) (canon, sorted []string, err error) {
	switch {
	case s.q.batch.insert == nil:
		return nil, nil, fmt.Errorf("sqlinbox: %s cannot claim in batches", s.dialect)
	case s.config.ShardKeyColumn != "":
		return nil, nil, errBatchShardKey
	case len(b.EventIDs) == 0:
		return nil, nil, errors.New("sqlinbox: a batch claim needs at least one event id")
	}
	canon = make([]string, len(b.EventIDs))
	for i, id := range b.EventIDs {
		if err := inboxdriver.ValidateEventID(id); err != nil {
			return nil, nil, err
		}
		if canon[i], err = s.CheckEventID(id); err != nil {
			return nil, nil, err
		}
	}
	sorted = slices.Clone(canon)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, nil, fmt.Errorf("sqlinbox: event id %s appears twice in one batch claim", errtext.Quote(sorted[i]))
		}
	}
	return canon, sorted, nil
}

// beginBatch opens the batch's transaction and claims sorted in it; fresh
// holds the new ids. tx is nil when BEGIN failed.
func (s *Store) beginBatch(ctx context.Context, b inboxdriver.BatchClaim, sorted []string) (tx *sql.Tx, fresh map[string]bool, err error) {
	if tx, err = s.beginSerialized(ctx, b); err != nil {
		return nil, nil, s.dialect.classify(err)
	}
	fresh = make(map[string]bool, len(sorted))
	mixed := false
	err = s.serialized(ctx, tx, b.Consumer, func() error {
		for chunk := range slices.Chunk(sorted, maxBatchRows) {
			if mixed, err = s.claimChunk(ctx, tx, b.Consumer, chunk, fresh); err != nil || mixed {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return tx, nil, err
	}
	if mixed {
		// Which rows of a mixed chunk are new, the count cannot say:
		// claim every id on its own instead, in a new transaction.
		_ = tx.Rollback()
		return s.claimEach(ctx, b, sorted)
	}
	if len(fresh) > 0 && s.q.afterClaim != "" {
		if _, err := tx.ExecContext(ctx, s.q.afterClaim); err != nil {
			return tx, nil, s.dialect.classify(err)
		}
	}
	return tx, fresh, nil
}

// claimChunk claims ids, at most maxBatchRows of them, adding the new
// ones to fresh; mixed reports a count that cannot tell which are new.
func (s *Store) claimChunk(ctx context.Context, tx *sql.Tx, consumer string, ids []string, fresh map[string]bool) (mixed bool, err error) {
	bq := &s.q.batch
	args, err := bq.args(consumer, ids)
	if err != nil {
		return false, err
	}
	if bq.lock != nil {
		var result string
		if err := tx.QueryRowContext(ctx, bq.lock(len(ids)), args...).Scan(&result); err != nil {
			return false, s.dialect.classify(err)
		}
		if err := s.q.checkBeforeClaim(result); err != nil {
			return false, err
		}
	}
	if !bq.returning {
		res, err := tx.ExecContext(ctx, bq.insert(len(ids)), args...)
		if err != nil {
			return false, s.dialect.classify(err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, err
		}
		return readCount(n, ids, fresh)
	}
	rows, err := tx.QueryContext(ctx, bq.insert(len(ids)), args...)
	if err != nil {
		return false, s.dialect.classify(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return false, err
		}
		fresh[id] = true
	}
	if err := rows.Err(); err != nil {
		return false, s.dialect.classify(err)
	}
	return false, nil
}

// readCount reads the affected rows of a multi-row claim that cannot
// return the new ids: all of them are new, or none, or the chunk is mixed.
func readCount(n int64, ids []string, fresh map[string]bool) (mixed bool, err error) {
	switch {
	case n == int64(len(ids)):
		for _, id := range ids {
			fresh[id] = true
		}
		return false, nil
	case n == 0:
		return false, nil
	case n > 0 && n < int64(len(ids)):
		return true, nil
	}
	return false, fmt.Errorf("sqlinbox: a batch claim of %d events affected %d rows", len(ids), n)
}

// claimEach claims sorted one by one in a new transaction, as [Store.Claim]
// does: the batch's fallback where a multi-row count is ambiguous.
func (s *Store) claimEach(ctx context.Context, b inboxdriver.BatchClaim, sorted []string) (*sql.Tx, map[string]bool, error) {
	tx, err := s.beginSerialized(ctx, b)
	if err != nil {
		return nil, nil, s.dialect.classify(err)
	}
	fresh := make(map[string]bool, len(sorted))
	err = s.serialized(ctx, tx, b.Consumer, func() error {
		for _, id := range sorted {
			claimed, err := s.claim(ctx, tx, nil, inboxdriver.Claim{Consumer: b.Consumer, EventID: id})
			if err != nil {
				return err
			}
			if claimed {
				fresh[id] = true
			}
		}
		return nil
	})
	return tx, fresh, err
}

// beginSerialized begins a batch's transaction. Under a dialect's lock on
// the consumer's batch claims it does not end with ctx: database/sql would
// roll it back and pool its connection, lock and all, before the release
// could run. Each statement still ends with ctx (the driver then closes its
// connection, and the server drops the lock), and the caller always ends
// the transaction.
func (s *Store) beginSerialized(ctx context.Context, b inboxdriver.BatchClaim) (*sql.Tx, error) {
	if s.q.batch.serialize != "" {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ctx = context.WithoutCancel(ctx)
	}
	return s.db.BeginTx(ctx, b.TxOptions)
}

// serialized runs claims, the claim statements of a batch, under the
// dialect's lock on the consumer's batch claims, if it has one. A batch
// then waits for rows only of transactions past their claims, which wait
// for no claim: no cycle. The lock lives in the session, so it is given
// back before the transaction ends (beginSerialized), and with the
// connection if that dies.
func (s *Store) serialized(ctx context.Context, tx *sql.Tx, consumer string, claims func() error) error {
	bq := &s.q.batch
	if bq.serialize == "" {
		return claims()
	}
	var got sql.NullInt64
	if err := tx.QueryRowContext(ctx, bq.serialize, consumer).Scan(&got); err != nil {
		return s.dialect.classify(err)
	}
	if got.Int64 != 1 {
		return fmt.Errorf("%w: timed out waiting for another batch of consumer %q to claim", inboxdriver.ErrInFlight, consumer)
	}
	err := claims()
	if _, rerr := tx.ExecContext(context.WithoutCancel(ctx), bq.release, consumer); err == nil && rerr != nil {
		err = s.dialect.classify(rerr)
	}
	return err
}
