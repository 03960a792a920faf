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
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/inboxdriver"
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
	// poolWarned: a pool of one has been warned about ([Store.watchPoolOfOne]).
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
	if d, ok := config.Dialect.(batchDialect); ok {
		q.batch = d.batchQueries(t, config, q)
	}
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

// Maintenance returns the store's maintenance seam, for package [purge] and
// the inbox command; its type is internal to this module and may change in
// any release.
//
// [purge]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge
func (s *Store) Maintenance() maintenance.Store {
	if s == nil {
		return nil
	}
	return maintainer{s}
}
