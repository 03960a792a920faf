package pgxinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/poolgate"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Store records inbox claims in PostgreSQL through a pgx connection pool
// ([pgxpool.Pool]), without database/sql. Its claim sends BEGIN and the claim's
// INSERT to the server together, in one round trip, where database/sql spends
// one on BEGIN and one on the INSERT: behind the inbox a handler then makes
// exactly as many round trips as without it. Give it to [inbox.NewMiddleware]
// as any store; handlers take the transaction with [TxFromContext].
//
// Everything but the claim ([Store.CreateSchema], the purge) runs through
// [database/sql] on connections of the same pool, with the SQL of a
// [sqlinbox.Store] configured alike.
type Store struct {
	sql      *sqlinbox.Store
	db       *sql.DB
	pool     *pgxpool.Pool
	maxConns int // the pool's MaxConns
	claim    maintenance.ClaimSQL
	// consumerArg is the claim's first argument, converted once.
	consumerArg maintenance.ConsumerArg

	mu       sync.Mutex     // serialises the layout check
	verified atomic.Bool    // set by the first claim that succeeds
	gate     *poolgate.Gate // the pool's, shared by every store on it
}

var (
	_ inboxdriver.Store               = (*Store)(nil)
	_ inboxdriver.EventIDChecker      = (*Store)(nil)
	_ inboxdriver.FingerprintChecker  = (*Store)(nil)
	_ inboxdriver.TxWriteCounter      = (*Store)(nil)
	_ inboxdriver.ConsumerRegistry    = (*Store)(nil)
	_ inboxdriver.UnavailableDetector = (*Store)(nil)
	_ inboxdriver.ConflictDetector    = (*Store)(nil)
)

// NewStore returns a [Store] for pool, configured as a [sqlinbox.Store]:
// config.Dialect may be left empty (PostgreSQL is the only dialect pgx
// speaks), and any other dialect is refused. It takes [sqlinbox.Config]
// itself rather than a type of its own so that one configuration serves a
// service's stores, its purge and its schema alike, whichever driver holds
// the pool. Closing the store does not close the pool.
func NewStore(pool *pgxpool.Pool, config sqlinbox.Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgxinbox: invalid config: pool is nil")
	}
	if config.Dialect == nil {
		config.Dialect = sqlinbox.PostgreSQL
	}
	if config.Dialect != sqlinbox.PostgreSQL {
		return nil, fmt.Errorf("pgxinbox: invalid config: pgx speaks PostgreSQL, not %s", config.Dialect)
	}
	if mode := pool.Config().ConnConfig.DefaultQueryExecMode; config.TransactionPooling && !poolerSafe(mode) {
		return nil, fmt.Errorf("pgxinbox: invalid config: TransactionPooling needs an exec mode a pooler keeps, not %s: add default_query_exec_mode=exec to the DSN (docs/poolers.md)", mode)
	}
	maxConns := int(pool.Config().MaxConns)
	if maxConns < 2 {
		return nil, fmt.Errorf("pgxinbox: invalid config: the pool opens at most %d connection; give it at least 2 (pool_max_conns), so that the claims can leave one free", maxConns)
	}
	db := stdlib.OpenDBFromPool(pool)
	s, err := sqlinbox.New(db, config)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &Store{sql: s, db: db, pool: pool, maxConns: maxConns, claim: s.Maintenance().ClaimSQL(), gate: poolgate.For(pool)}, nil
}

// poolSize is the pool's MaxConns.
func (s *Store) poolSize() int { return s.maxConns }

// Pool returns the pool the store claims on.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Table returns the inbox table's name as configured.
func (s *Store) Table() string { return s.sql.Table() }

// CreateSchema is [sqlinbox.Store.CreateSchema].
func (s *Store) CreateSchema(ctx context.Context) error { return s.sql.CreateSchema(ctx) }

// SchemaSQL is [sqlinbox.Store.SchemaSQL].
func (s *Store) SchemaSQL() string { return s.sql.SchemaSQL() }

// LeaseTable is [sqlinbox.Store.LeaseTable].
func (s *Store) LeaseTable() string { return s.sql.LeaseTable() }

// Heartbeat implements [inboxdriver.ConsumerRegistry] as
// [sqlinbox.Store.Heartbeat] does, on the connection of the pool the claims
// leave free.
func (s *Store) Heartbeat(ctx context.Context, h inboxdriver.Heartbeat) ([]string, error) {
	ctx, ticket, err := s.gate.Beside(ctx, s.poolSize)
	if err != nil {
		return nil, fmt.Errorf("pgxinbox: waiting for the connection the claims leave free: %w", err)
	}
	defer ticket.Leave()
	return s.sql.Heartbeat(ctx, h)
}

// IsUnavailable implements [inboxdriver.UnavailableDetector] as
// [sqlinbox.Store.IsUnavailable] does.
func (s *Store) IsUnavailable(err error) bool { return s.sql.IsUnavailable(err) }

// SchemaStatements is [sqlinbox.Store.SchemaStatements].
func (s *Store) SchemaStatements() []string { return s.sql.SchemaStatements() }

// AddFingerprintColumnSQL is [sqlinbox.Store.AddFingerprintColumnSQL].
func (s *Store) AddFingerprintColumnSQL() string { return s.sql.AddFingerprintColumnSQL() }

// Maintenance is [sqlinbox.Store.Maintenance], for package [purge] and the
// inbox command; its type is internal to this module and may change in any
// release.
//
// [purge]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge
func (s *Store) Maintenance() maintenance.Store { return s.sql.Maintenance() }

// OldestClaim is [sqlinbox.Store.OldestClaim].
func (s *Store) OldestClaim(ctx context.Context) (time.Time, bool, error) {
	return s.sql.OldestClaim(ctx)
}

// CheckEventID implements [inboxdriver.EventIDChecker] as
// [sqlinbox.Store.CheckEventID] does.
func (s *Store) CheckEventID(id string) (string, error) { return s.sql.CheckEventID(id) }

// IsConflict reports whether err is PostgreSQL aborting the transaction for
// a concurrent one (SQLSTATE 40001 or 40P01), as
// [sqlinbox.Store.IsConflict] does; pgx's errors carry the SQLSTATE too.
func (s *Store) IsConflict(err error) bool { return s.sql.IsConflict(err) }

// CheckFingerprints implements [inboxdriver.FingerprintChecker] as
// [sqlinbox.Store.CheckFingerprints] does.
func (s *Store) CheckFingerprints() error { return s.sql.CheckFingerprints() }

// Close releases the database/sql handle the store uses besides the pool;
// the pool stays open.
func (s *Store) Close() error {
	return errors.Join(s.sql.Close(), s.db.Close())
}

// Claim implements [inboxdriver.Store] on a pooled connection, in one round
// trip: BEGIN and the INSERT are pipelined, with the event's lock between
// them on a table partitioned by processed_at. For a duplicate or an error
// the transaction is already rolled back and its connection back in the
// pool; for a duplicate with a fingerprint, reading the original's costs one
// more round trip. While the claims hold all of the pool's connections but
// one, a claim waits for one of them to end before it takes a connection,
// as [sqlinbox.Store.Claim] does.
func (s *Store) Claim(ctx context.Context, claim inboxdriver.Claim) (inboxdriver.Tx, []byte, error) {
	consumer, eventID, fingerprint := claim.Consumer, claim.EventID, claim.Fingerprint
	if fingerprint != nil {
		if err := s.CheckFingerprints(); err != nil {
			return nil, nil, err
		}
	}
	txOpts, err := txOptions(claim.TxOptions)
	if err != nil {
		return nil, nil, err
	}
	if !s.verified.Load() {
		if err := s.verify(ctx); err != nil {
			return nil, nil, err
		}
	}
	c := &s.claim
	cb := &claimBatch{}
	var args []any
	if c.OnlyIDs {
		cb.args = [2]any{s.consumerArg.Arg(consumer), eventID}
		args = cb.args[:]
	} else if args, err = c.Args(claim); err != nil {
		return nil, nil, err
	}
	ticket, err := s.gate.Enter(ctx, s.poolSize)
	if err != nil {
		return nil, nil, fmt.Errorf("pgxinbox: waiting for a connection the other claims leave free: %w", err)
	}
	// BEGIN is part of the batch, never sent apart from it: a claim sent
	// without BEGIN would commit on its own, and a failing handler would
	// then leave the event marked as processed.
	b := &cb.batch
	b.QueuedQueries = cb.queued[:0]
	b.BeginTx(txOpts)
	if c.Before != "" {
		b.Queue(c.Before, consumer, eventID)
	}
	cb.insert = pgx.QueuedQuery{SQL: c.Insert, Arguments: args}
	b.QueuedQueries = append(b.QueuedQueries, &cb.insert)
	if c.After != "" {
		b.Queue(c.After)
	}
	br := s.pool.SendBatch(ctx, b)
	tx := br.Tx()
	claimed, err := s.readClaim(br)
	// Close before the transaction is used: the connection carries the
	// batch until then. A failed statement has aborted the transaction,
	// which only a rollback ends.
	if cerr := br.Close(); err == nil && cerr != nil {
		err = c.Classify(cerr)
	}
	if err == nil && !s.verified.Load() {
		s.verified.Store(true)
	}
	if err == nil && claimed {
		return &claimTx{tx: tx, ticket: ticket}, nil, nil
	}
	defer ticket.Leave()
	var stored []byte
	if err == nil && fingerprint != nil {
		// Under READ COMMITTED this statement sees the committed row the
		// claim found; under REPEATABLE READ the claim saw only rows of
		// its snapshot, which this one shares.
		err = tx.QueryRow(ctx, c.Fingerprint, args[:len(args)-1]...).Scan(&stored)
		if errors.Is(err, pgx.ErrNoRows) { // purged meanwhile
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("pgxinbox: reading the fingerprint of a duplicate: %w", c.Classify(err))
		}
	}
	// Rollback also hands the connection back to the pool; when BEGIN
	// itself failed the transaction is already closed and this only
	// releases the connection.
	_ = tx.Rollback(context.WithoutCancel(ctx))
	if err != nil {
		return nil, nil, err
	}
	return nil, stored, nil
}

// claimBatch is the batch of one claim in a single allocation: the batch,
// room for its statements (BEGIN, the event's lock, the claim, the
// statement after it), the claim's queued query and its arguments. It is
// new for every claim, never reused: pgx keeps each connection's prepared
// statement in the queued query it sends.
type claimBatch struct {
	batch  pgx.Batch
	queued [4]*pgx.QueuedQuery
	insert pgx.QueuedQuery
	args   [2]any
}

func (s *Store) readClaim(br pgx.BatchResults) (bool, error) {
	c := &s.claim
	if _, err := br.Exec(); err != nil { // BEGIN
		return false, c.Classify(err)
	}
	if c.Before != "" {
		var result string
		if err := br.QueryRow().Scan(&result); err != nil {
			return false, c.Classify(err)
		}
		// The claim already ran; failing here rolls it back.
		if err := c.CheckBefore(result); err != nil {
			return false, err
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return false, c.Classify(err)
	}
	if claimed, err := c.Claimed(tag.RowsAffected()); !claimed {
		return false, err
	}
	if c.After != "" {
		if _, err := br.Exec(); err != nil {
			return false, c.Classify(err)
		}
	}
	return true, nil
}

// verify runs the dialect's check of the table until a claim succeeds, so
// that a store created before its table checks the table once it exists.
func (s *Store) verify(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.verified.Load() || s.claim.Verify == nil {
		return nil
	}
	return s.claim.Verify(ctx)
}

// poolerSafe reports whether pgx's exec mode sends each statement in one
// go, without a named prepared statement: cache_statement prepares named
// statements, describe_exec describes the unnamed statement in one round
// trip and runs it in the next, and behind a transaction-pooling proxy
// each may reach another server connection.
func poolerSafe(mode pgx.QueryExecMode) bool {
	switch mode {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheDescribe:
		return true
	}
	return false
}

// txOptions maps database/sql transaction options ([inbox.Config.TxOptions])
// to pgx's ([pgx.TxOptions]), as pgx's own database/sql driver ([stdlib])
// does.
func txOptions(opts *sql.TxOptions) (pgx.TxOptions, error) {
	var o pgx.TxOptions
	if opts == nil {
		return o, nil
	}
	switch sql.IsolationLevel(opts.Isolation) {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		o.IsoLevel = pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		o.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		o.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		o.IsoLevel = pgx.Serializable
	default:
		return o, fmt.Errorf("pgxinbox: PostgreSQL has no isolation level %s (inbox.Config.TxOptions)", opts.Isolation)
	}
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	return o, nil
}

// CountTxWrites implements [inboxdriver.TxWriteCounter] with the statement
// of [sqlinbox.Store.CountTxWrites], on the claim's pgx transaction.
func (s *Store) CountTxWrites(ctx context.Context, tx inboxdriver.Tx) (int64, bool, error) {
	t, ok := tx.Handle().(pgx.Tx)
	if !ok || s.claim.TxWrites == "" {
		return 0, false, nil
	}
	// The grant first, as sqlinbox counts: a failed count would abort the
	// claim's transaction.
	if s.claim.TxWritesGranted != "" {
		var granted bool
		if err := t.QueryRow(ctx, s.claim.TxWritesGranted).Scan(&granted); err != nil {
			return 0, false, fmt.Errorf("pgxinbox: counting the transaction's writes: %w", err)
		}
		if !granted {
			return 0, false, errors.New("pgxinbox: counting the transaction's writes: SELECT on pg_stat_xact_user_tables is not granted (SQLSTATE 42501)")
		}
	}
	var n *int64
	if err := t.QueryRow(ctx, s.claim.TxWrites).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("pgxinbox: counting the transaction's writes: %w", err)
	}
	if n == nil {
		return 0, false, nil
	}
	return *n, true, nil
}

// claimTx is a new claim's transaction, holding its place in the store's
// gate until it ends.
type claimTx struct {
	tx     pgx.Tx
	ticket poolgate.Ticket
}

func (t *claimTx) Commit(ctx context.Context) error {
	defer t.ticket.Leave()
	return t.tx.Commit(ctx)
}

func (t *claimTx) Rollback(ctx context.Context) error {
	defer t.ticket.Leave()
	return t.tx.Rollback(ctx)
}

// Handle returns the [pgx.Tx] the handler writes through.
func (t *claimTx) Handle() any { return t.tx }
