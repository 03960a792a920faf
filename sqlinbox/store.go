// Package sqlinbox stores inbox claims in a SQL database through
// [database/sql]: PostgreSQL (lib/pq or pgx's stdlib), MySQL/MariaDB
// (go-sql-driver/mysql) and SQLite (modernc.org/sqlite). All of the library's
// SQL lives in this package; [pgxinbox] sends the same statements through pgx.
//
// It links no database driver: import the one you use, as for any
// database/sql program. Driver errors are recognised without the drivers'
// packages (PostgreSQL's by their SQLSTATE method, MySQL's by the error
// type's shape), so a program built for SQLite carries no PostgreSQL or
// MySQL driver.
//
// [pgxinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox
package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/poolgate"
)

// DefaultTable is the inbox table's name when [Config.Table] is empty.
const DefaultTable = "watermill_inbox"

// Config configures [New].
type Config struct {
	// Dialect is the database's SQL flavour: [PostgreSQL], [MySQL] or
	// [SQLite]. Required.
	Dialect Dialect

	// Table is the inbox table, optionally schema-qualified ("app.inbox"):
	// lowercase letters, digits and underscores. Defaults to [DefaultTable].
	Table string

	// UUIDEventIDs stores event ids in a native UUID column (PostgreSQL
	// uuid, 16 bytes instead of 37 and a smaller index; MySQL BINARY(16);
	// SQLite keeps text) and rejects ids that are not UUIDs with
	// [inboxdriver.ErrInvalidEventID] before any SQL runs. Ids are stored in
	// canonical lowercase form. It must match the table
	// [Store.CreateSchema] made. Defaults to false: any id up to
	// [inbox.MaxEventIDLength] bytes.
	//
	// [inbox.MaxEventIDLength]: https://pkg.go.dev/github.com/watermill-inbox/inbox#MaxEventIDLength
	UUIDEventIDs bool

	// ClaimTimeout bounds how long a claim waits for another transaction
	// holding the same (consumer, event id), that is a duplicate delivered
	// while the first copy is still being handled. When it expires the claim
	// fails with an error wrapping [inbox.ErrInFlight] and the message is
	// retried later instead of holding a connection. Only the claim
	// statement is bounded, never the handler's: PostgreSQL lock_timeout,
	// set for the claim and then put back to the session's value;
	// MariaDB innodb_lock_wait_timeout through SET STATEMENT, whole seconds
	// rounded up (MySQL 8 cannot scope it to a statement and the first claim
	// fails with [ErrClaimTimeoutUnsupported]); SQLite refuses it in [New],
	// its DSN's busy_timeout is the bound. New refuses one longer than the
	// setting takes: 2,147,483,647 ms (24.8 days) on PostgreSQL,
	// 100,000,000 s on MariaDB. Defaults to 0: wait until the other
	// transaction ends.
	//
	// [inbox.ErrInFlight]: https://pkg.go.dev/github.com/watermill-inbox/inbox#ErrInFlight
	ClaimTimeout time.Duration

	// Partitioning makes [Store.CreateSchema] create a PostgreSQL table
	// partitioned by time ([Daily] or [Monthly]), with the partitions of
	// the current period and of the [SchemaPartitionsAhead] next ones,
	// whose purge drops whole partitions instead of deleting rows; see
	// package purge. It must match the table CreateSchema made. Defaults to
	// [NoPartitioning].
	Partitioning Partitioning

	// PartitionKey is the time [Config.Partitioning] splits by.
	// [ProcessedAt] takes any event id, but each claim first takes a lock
	// on the event's key so that a duplicate is found in any partition (one
	// more round trip on database/sql, none on a pgxinbox.Store, whose
	// batch carries it), and needs READ COMMITTED. [EventIDTime] claims as
	// fast as a plain table, but takes only ids that carry their time
	// (UUIDv7, ULID). It must match the table [Store.CreateSchema] made.
	// Defaults to [ProcessedAt].
	PartitionKey PartitionKey

	// Fingerprints adds a nullable fingerprint column to the table
	// [Store.CreateSchema] makes (PostgreSQL bytea, MySQL VARBINARY(64),
	// SQLite BLOB) and makes the [Store] an [inboxdriver.FingerprintChecker], for
	// the middleware's id-reuse detection ([inbox.Config.Fingerprint]). An
	// existing table needs the column added once; see [Store.SchemaSQL].
	// Rows claimed before have no fingerprint and never count as a reused
	// id. Defaults to false: the claim writes two columns, as it always
	// did.
	//
	// [inbox.Config.Fingerprint]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config.Fingerprint
	Fingerprints bool

	// ShardKeyColumn names a column the table [Store.CreateSchema] makes
	// holds each claim's shard key (VARBINARY(255), the key of the rows
	// the handler writes, such as a customer id), for a MySQL database
	// sharded by Vitess whose vschema shards the inbox table by this
	// column with the vindex of the handler's own tables: the claim then
	// lands on the shard of the handler's writes, and the transaction never
	// spans shards (see docs/databases.md). Every copy of an event must
	// carry the same key: the primary key (consumer, event_id) is unique
	// per shard only. A claim without a key is refused with
	// [ErrShardKey]. MySQL only; it must match the table CreateSchema
	// made. Defaults to "": no shard key, the table is sharded by
	// event_id if at all.
	ShardKeyColumn string

	// TransactionPooling declares that the store reaches PostgreSQL through
	// a proxy that pools server connections per transaction (PgBouncer's
	// pool_mode = transaction before 1.21, or without
	// max_prepared_statements; Supavisor, RDS Proxy, CloudNativePG's
	// Pooler in transaction mode): the claim is then never prepared, since
	// a prepared statement lives on one server connection and the next
	// transaction may get another. The DSN needs settings of its own
	// (lib/pq binary_parameters=yes; pgx default_query_exec_mode=exec):
	// see docs/poolers.md. PostgreSQL only.
	//
	// Defaults to false: the claim is prepared once per connection, which
	// saves lib/pq a round trip per message. A store that then finds its
	// prepared claim lost (SQLSTATE 26000 or 42P05, which only such a
	// proxy causes) claims unprepared from then on, saying so once through
	// [Config.Logger], and retries that claim, losing nothing; until then,
	// lib/pq's numbered statement names can make a claim run another
	// program's statement of the same number, so set it behind a proxy.
	TransactionPooling bool

	// Logger receives what the store does on its own: partitions
	// [Store.CreateSchema] leaves to the purge, and a store that finds
	// itself behind a transaction-pooling proxy (see
	// [Config.TransactionPooling]). Defaults to [watermill.NopLogger].
	Logger watermill.LoggerAdapter
}

// Store records inbox claims in one table. It implements [inboxdriver.Store]. It does
// not own the [*sql.DB]: close the database yourself, after [Store.Close].
type Store struct {
	db      *sql.DB
	dialect Dialect
	table   tableName
	config  Config
	q       queries

	mu       sync.Mutex // serialises preparing claimSQL and the layout check
	claimSQL atomic.Pointer[sql.Stmt]
	verified atomic.Bool // set by the first claim that succeeds
	// unprepared sends the claim as a plain statement: under
	// [Config.TransactionPooling], or once a pooler lost the prepared one.
	unprepared atomic.Bool
	// consumerArg is the claim's first argument, converted once.
	consumerArg maintenance.ConsumerArg
	// gate leaves one connection of db free of claims (package poolgate),
	// shared by every store on db.
	gate *poolgate.Gate
	// poolWarned: a pool of one has been warned about (pool_of_one.go).
	poolWarned atomic.Bool
}

var (
	_ inboxdriver.Store               = (*Store)(nil)
	_ inboxdriver.EventIDChecker      = (*Store)(nil)
	_ inboxdriver.FingerprintChecker  = (*Store)(nil)
	_ inboxdriver.UnavailableDetector = (*Store)(nil)
	_ inboxdriver.ConflictDetector    = (*Store)(nil)
)

// New returns a [Store] for db. It validates the configuration but does not
// touch the database; call [Store.CreateSchema] (or apply [Store.SchemaSQL]
// with a migration tool) before the first message. A [Dialect] that does not
// match db's driver ([PostgreSQL] on go-sql-driver/mysql) is refused; a driver
// New cannot recognise (wrapped by a tracing package) passes, and then
// CreateSchema and the first claim name the mismatch from the database's
// answer.
func New(db *sql.DB, config Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("sqlinbox: invalid config: db is nil")
	}
	if config.Dialect == nil {
		return nil, errors.New("sqlinbox: invalid config: Dialect is required (sqlinbox.PostgreSQL, sqlinbox.MySQL or sqlinbox.SQLite)")
	}
	if config.Table == "" {
		config.Table = DefaultTable
	}
	t, err := parseTableName(config.Table)
	if err != nil {
		return nil, fmt.Errorf("sqlinbox: invalid config: Table: %w", err)
	}
	if config.ClaimTimeout < 0 {
		return nil, fmt.Errorf("sqlinbox: invalid config: ClaimTimeout is negative (%s)", config.ClaimTimeout)
	}
	if limit, setting := config.Dialect.claimTimeoutLimit(); limit > 0 && config.ClaimTimeout > limit {
		return nil, fmt.Errorf("sqlinbox: invalid config: ClaimTimeout %s is above %s, the longest %s takes", config.ClaimTimeout, limit, setting)
	}
	if config.TransactionPooling && config.Dialect != PostgreSQL {
		return nil, fmt.Errorf("sqlinbox: invalid config: TransactionPooling is for PostgreSQL behind a transaction-pooling proxy, not %s", config.Dialect)
	}
	if config.Logger == nil {
		config.Logger = watermill.NopLogger{}
	}
	if err := checkPartitioning(config); err != nil {
		return nil, fmt.Errorf("sqlinbox: invalid config: %w", err)
	}
	if err := checkShardKeyColumn(config); err != nil {
		return nil, fmt.Errorf("sqlinbox: invalid config: %w", err)
	}
	q := config.Dialect.queries(t, config)
	if q.configErr != nil {
		return nil, fmt.Errorf("sqlinbox: invalid config: %w", q.configErr)
	}
	if err := checkDriver(db, config.Dialect); err != nil {
		return nil, fmt.Errorf("sqlinbox: invalid config: %w", err)
	}
	q.leases = config.Dialect.leases(t)
	q.schema = append(q.schema, q.leases.create)
	if q.schemaObjects != nil {
		q.schemaObjects = append(q.schemaObjects, t.derived(leaseSuffix))
	}
	s := &Store{
		db:      db,
		dialect: config.Dialect,
		table:   t,
		config:  config,
		q:       q,
		gate:    poolgate.For(db),
	}
	s.unprepared.Store(config.TransactionPooling)
	return s, nil
}

// poolSize is db's [sql.DB.SetMaxOpenConns] limit, 0 for none.
func (s *Store) poolSize() int { return s.db.Stats().MaxOpenConnections }

// DB returns the database the store writes to.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// Table returns the inbox table's name as configured.
func (s *Store) Table() string { return s.table.String() }

// Partitioning returns the table layout the store was configured with.
func (s *Store) Partitioning() Partitioning { return s.config.Partitioning }

// ShardKeyColumn returns [Config.ShardKeyColumn], "" for none.
func (s *Store) ShardKeyColumn() string { return s.config.ShardKeyColumn }

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

// dialectErr wraps err, returned by the database for the store's SQL, with
// the dialect mismatch it shows, if any: the check in [New] lets wrapped
// drivers through, the database's own errors do not.
func (s *Store) dialectErr(err error) error {
	found := answeredAs(err)
	if found == nil || found == s.dialect {
		return err
	}
	return fmt.Errorf("Dialect is %s but the database answered as %s, set Config.Dialect to sqlinbox.%s: %w", s.dialect, found, dialectName(found), err)
}
