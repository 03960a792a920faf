package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/internal/poolgate"
)

// Claim implements [inboxdriver.Store]: BEGIN, then the claim as the
// transaction's first statement. The claim is a prepared statement, so after
// the first use on a connection it costs one round trip on every driver;
// under [Config.TransactionPooling] it is sent unprepared (one round trip with
// the DSN settings that setting needs). While the claims hold all of db's
// connections but one, a claim waits for one of them to end before it takes
// a connection: a handler that takes a second connection from db then waits
// for the one left free instead of wedging the consumer.
//
// For a duplicate with a fingerprint it reads the original's in the claim's
// transaction, which by then sees the committed row the claim found (a
// statement later, under READ COMMITTED; in the same snapshot under
// REPEATABLE READ, where the claim sees only rows it can read), then rolls
// back.
func (s *Store) Claim(ctx context.Context, c inboxdriver.Claim) (inboxdriver.Tx, []byte, error) {
	if err := s.checkShardKey(c.ShardKey); err != nil {
		return nil, nil, err
	}
	if c.Fingerprint != nil {
		if err := s.CheckFingerprints(); err != nil {
			return nil, nil, err
		}
	}
	if !s.verified.Load() {
		if err := s.verify(ctx); err != nil {
			return nil, nil, err
		}
	}
	var stmt *sql.Stmt
	if !s.unprepared.Load() {
		var err error
		switch stmt, err = s.claimStmt(ctx); {
		case lostPrepared(err):
			s.claimUnprepared(err)
			stmt = nil
		case err != nil:
			return nil, nil, err
		default: // the table exists, and was checked
			s.verified.Store(true)
		}
	}
	ticket, err := s.gate.Enter(ctx, s.poolSize)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlinbox: waiting for a connection the other claims leave free: %w", err)
	}
	tx, claimed, err := s.begin(ctx, stmt, c)
	if err == nil && claimed {
		t := &claimTx{tx: tx, ticket: ticket}
		s.watchPoolOfOne(t)
		return t, nil, nil
	}
	var stored []byte
	if err == nil && c.Fingerprint != nil {
		stored, err = s.storedFingerprint(ctx, tx, c)
	}
	if tx != nil {
		_ = tx.Rollback()
	}
	ticket.Leave()
	if err != nil {
		return nil, nil, err
	}
	return nil, stored, nil
}

// begin opens the claim's transaction and claims in it; tx is nil when
// BEGIN failed.
func (s *Store) begin(ctx context.Context, stmt *sql.Stmt, c inboxdriver.Claim) (*sql.Tx, bool, error) {
	tx, err := s.db.BeginTx(ctx, c.TxOptions)
	if err != nil {
		return nil, false, s.dialect.classify(err)
	}
	claimed, err := s.claim(ctx, tx, stmt, c)
	if stmt != nil && lostPrepared(err) {
		// The statement failed before it ran: nothing was claimed, and
		// the same claim, unprepared, in a new transaction, is the first.
		_ = tx.Rollback()
		s.claimUnprepared(err)
		if tx, err = s.db.BeginTx(ctx, c.TxOptions); err != nil {
			return nil, false, s.dialect.classify(err)
		}
		claimed, err = s.claim(ctx, tx, nil, c)
	}
	if err == nil && !s.verified.Load() {
		s.verified.Store(true)
	}
	return tx, claimed, err
}

// claimTx is a new claim's transaction, holding its place in the store's
// gate until it ends.
type claimTx struct {
	tx     *sql.Tx
	ticket poolgate.Ticket
	watch  *time.Timer // on a pool of one
}

// Commit commits the transaction; database/sql's Commit takes no context.
func (t *claimTx) Commit(context.Context) error {
	defer t.end()
	return t.tx.Commit()
}

// Rollback rolls the transaction back.
func (t *claimTx) Rollback(context.Context) error {
	defer t.end()
	return t.tx.Rollback()
}

func (t *claimTx) end() {
	if t.watch != nil {
		t.watch.Stop()
	}
	t.ticket.Leave()
}

// Handle returns the [*sql.Tx] the handler writes through.
func (t *claimTx) Handle() any { return t.tx }

// storedFingerprint reads the fingerprint of a duplicate's original; nil
// when it has none or was purged meanwhile. A function of its own, so that
// the variable Scan fills escapes to the heap only for duplicates that need
// it.
func (s *Store) storedFingerprint(ctx context.Context, tx *sql.Tx, c inboxdriver.Claim) ([]byte, error) {
	var stored []byte
	c.Fingerprint = nil
	args, err := s.claimArgs(c)
	if err != nil {
		return nil, err
	}
	err = tx.QueryRowContext(ctx, s.q.fingerprint, args[:len(args)-1]...).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: reading the fingerprint of a duplicate: %w", s.dialect.classify(err))
	}
	return stored, nil
}

// CheckFingerprints implements [inboxdriver.FingerprintChecker]: it fails unless
// [Config.Fingerprints] is set.
func (s *Store) CheckFingerprints() error {
	if !s.config.Fingerprints {
		return fmt.Errorf("sqlinbox: %s is configured without fingerprints; set sqlinbox.Config.Fingerprints (and add the column to an existing table, see Store.SchemaSQL)", s.table)
	}
	return nil
}

// claim runs the claim statement, prepared as stmt or, when stmt is nil,
// unprepared; the fingerprint is its third parameter when [Config.Fingerprints]
// is set (nil stores NULL).
func (s *Store) claim(ctx context.Context, tx *sql.Tx, stmt *sql.Stmt, c inboxdriver.Claim) (bool, error) {
	if s.q.beforeClaim != "" {
		var result string
		if err := tx.QueryRowContext(ctx, s.q.beforeClaim, c.Consumer, c.EventID).Scan(&result); err != nil {
			return false, s.dialect.classify(err)
		}
		if err := s.q.checkBeforeClaim(result); err != nil {
			return false, err
		}
	}
	var (
		res sql.Result
		err error
	)
	switch {
	case stmt != nil && s.onlyIDs():
		// The common case without building a slice, and with the consumer
		// converted once per store: two allocations less.
		res, err = tx.StmtContext(ctx, stmt).ExecContext(ctx, s.consumerArg.Arg(c.Consumer), c.EventID)
	default:
		var args []any
		if args, err = s.claimArgs(c); err != nil {
			return false, err
		}
		if stmt != nil {
			res, err = tx.StmtContext(ctx, stmt).ExecContext(ctx, args...)
		} else {
			res, err = tx.ExecContext(ctx, unpreparedClaim+s.q.claim, args...)
		}
	}
	if err != nil {
		return false, s.dialect.classify(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if claimed, err := s.claimed(n); !claimed {
		return false, err
	}
	if s.q.afterClaim != "" {
		if _, err := tx.ExecContext(ctx, s.q.afterClaim); err != nil {
			return false, s.dialect.classify(err)
		}
	}
	return true, nil
}

// onlyIDs reports that the claim's parameters are the consumer and the
// event id alone.
func (s *Store) onlyIDs() bool {
	return !s.q.idTime && !s.config.Fingerprints && s.config.ShardKeyColumn == ""
}

// claimArgs are the claim's parameters: the consumer, the event id, the
// time inside the id on a table partitioned by it, and the fingerprint
// under [Config.Fingerprints].
func (s *Store) claimArgs(c inboxdriver.Claim) ([]any, error) {
	args := make([]any, 2, 4)
	args[0], args[1] = c.Consumer, c.EventID
	if s.q.idTime {
		at, err := s.eventIDTime(c.EventID)
		if err != nil {
			return nil, err
		}
		args = append(args, at)
	}
	if s.config.ShardKeyColumn != "" {
		args = append(args, c.ShardKey)
	}
	if s.config.Fingerprints {
		args = append(args, nullBytes(c.Fingerprint))
	}
	return args, nil
}

// eventIDTime returns the time inside id, for a table partitioned by it;
// an id without one is refused as [Store.CheckEventID] would refuse it.
func (s *Store) eventIDTime(id string) (time.Time, error) {
	at, err := inboxdriver.EventIDTime(id)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %s %v, and %s is partitioned by the time inside event ids (sqlinbox.EventIDTime)", inboxdriver.ErrInvalidEventID, errtext.Quote(id), err, s.table)
	}
	return at, nil
}

// verify runs the dialect's check of the table until a claim succeeds, so
// that a store created before its table checks the table once it exists.
func (s *Store) verify(ctx context.Context) error {
	if s.q.verify == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.verified.Load() {
		return nil
	}
	if err := s.q.verify(ctx, s.db, s.q); err != nil {
		if mismatch := s.dialectErr(err); mismatch != err {
			return fmt.Errorf("sqlinbox: %w", mismatch)
		}
		return err
	}
	return nil
}

// claimStmt prepares the claim once per [Store] ([database/sql] then prepares
// it once per connection). A failure is not cached: the next message retries,
// so a store created before its table works once the table exists.
func (s *Store) claimStmt(ctx context.Context) (*sql.Stmt, error) {
	if stmt := s.claimSQL.Load(); stmt != nil {
		return stmt, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if stmt := s.claimSQL.Load(); stmt != nil {
		return stmt, nil
	}
	stmt, err := s.db.PrepareContext(ctx, s.q.claim)
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: preparing the claim on %s: %w", s.table, s.dialectErr(s.dialect.classify(err)))
	}
	s.claimSQL.Store(stmt)
	return stmt, nil
}

// unpreparedClaim starts the text of the claim sent unprepared. pgx's
// database/sql driver names a statement prepared through it by its text,
// and runs any later statement of the same text on that connection through
// it: after a switch to unprepared claims, the claim's text must differ
// from the one prepared before.
const unpreparedClaim = "/* unprepared */ "

// lostPrepared reports whether err is PostgreSQL not finding a prepared
// statement on the connection that prepared it, or finding one of the same
// name there already: both mean that a proxy gave this client another
// server connection than the one the statement lives on (a
// transaction-pooling proxy), not a problem of the table.
func lostPrepared(err error) bool {
	switch pgCode(err) {
	case "26000", // invalid_sql_statement_name
		"42P05": // duplicate_prepared_statement
		return true
	}
	return false
}

// claimUnprepared switches the store to unprepared claims for good, after
// a transaction-pooling proxy lost its prepared claim (err), and says so
// once.
func (s *Store) claimUnprepared(err error) {
	if !s.unprepared.CompareAndSwap(false, true) {
		return
	}
	// The prepared statement stays open (Close closes it) for claims
	// already using it: they fail the same way and switch too.
	// Until a store notices, a numbered prepared statement can reach a
	// connection where another program's statement holds that number.
	s.config.Logger.Error("Inbox: a transaction-pooling proxy lost the prepared claim; claiming unprepared from now on. Set sqlinbox.Config.TransactionPooling to start so", err, watermill.LogFields{"table": s.table.String()})
}

// Close releases the prepared claim statement. The [Store] can still be used
// afterwards; it prepares the statement again.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stmt := s.claimSQL.Swap(nil); stmt != nil {
		return stmt.Close()
	}
	return nil
}

// CheckEventID implements [inboxdriver.EventIDChecker]. In [Config.UUIDEventIDs] mode
// it rejects ids that are not UUIDs and returns the canonical lowercase form;
// on a table partitioned by [EventIDTime] it rejects ids that carry no time;
// otherwise every id passes unchanged.
func (s *Store) CheckEventID(id string) (string, error) {
	if s.q.idTime {
		if _, err := s.eventIDTime(id); err != nil {
			return "", err
		}
	}
	if !s.config.UUIDEventIDs {
		return id, nil
	}
	canonical, ok := canonicalUUID(id)
	if !ok {
		return "", fmt.Errorf("%w: %s is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx), and %s stores UUID event ids", inboxdriver.ErrInvalidEventID, errtext.Quote(id), s.table)
	}
	return canonical, nil
}

// canonicalUUID accepts exactly the 36-character hyphenated form, in either
// case, and lowercases it, so every dialect stores the same text.
func canonicalUUID(id string) (string, bool) {
	if len(id) != 36 {
		return "", false
	}
	b := []byte(id)
	for i, c := range b {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return "", false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			b[i] = c + ('a' - 'A')
		default:
			return "", false
		}
	}
	return string(b), true
}

// nullBytes makes a nil slice an untyped nil, which every driver sends as
// NULL.
func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return b
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

// checkShardKey refuses a claim's shard key that the table cannot store
// where every copy of the event would find it: a missing one would put
// every claim on the shard of the empty key, away from the handler's rows.
func (s *Store) checkShardKey(key string) error {
	col := s.config.ShardKeyColumn
	switch {
	case col == "" && key != "":
		return fmt.Errorf("%w: %s has no shard key column; set sqlinbox.Config.ShardKeyColumn, or no shard key", ErrShardKey, s.table)
	case col == "":
		return nil
	case key == "":
		return fmt.Errorf("%w: %s stores a shard key in column %s and the claim has none; set inbox.Config.ShardKey", ErrShardKey, s.table, col)
	case len(key) > MaxShardKeyLength:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrShardKey, len(key), MaxShardKeyLength)
	}
	return nil
}

// onVitess reports whether the store's first claim found Vitess's vtgate.
// vtgate answers SHOW SESSION STATUS from another connection than the
// transaction's, so [Store.CountTxWrites] cannot tell there.
func (s *Store) onVitess() bool { return s.q.vitess != nil && s.q.vitess.Load() }

// poolOfOneWarning is how long a claim may hold the only connection of a
// pool of one (SetMaxOpenConns(1), the usual advice for SQLite) while
// another caller waits for it before the store says so. A handler that asks
// the pool for a second connection then waits for its own transaction
// forever; but the waiter may as well be a health probe beside a slow
// handler, so this only warns, once per store, and never cancels anything.
const poolOfOneWarning = 10 * time.Second

// watchPoolOfOne starts t's watch when db is a pool of one: callers that
// begin waiting for a connection after the claim (its own wait for BEGIN
// is behind it) and still wait when the watch fires can only be served
// once t ends.
func (s *Store) watchPoolOfOne(t *claimTx) {
	if s.gate.Size() != 1 {
		return
	}
	waits := s.db.Stats().WaitCount
	t.watch = time.AfterFunc(poolOfOneWarning, func() {
		if s.db.Stats().WaitCount > waits && s.poolWarned.CompareAndSwap(false, true) {
			s.config.Logger.Error("Inbox: a claim held the pool's only connection for 10 s while a caller waited; a handler asking the pool for one waits for itself", nil, watermill.LogFields{
				"table": s.table.String(), "remedy": "write through the inbox transaction, and give the pool two connections or more",
			})
		}
	})
}
