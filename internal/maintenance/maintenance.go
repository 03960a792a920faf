// Package maintenance is the seam between the inbox stores and the code that
// looks after an inbox table rather than claiming in it (package [purge], the
// operator command), or claims in it through another driver with the
// store's SQL ([pgxinbox]). A store implements [Store] in its own package, next
// to its SQL ([sqlinbox] today), and hands it out through its one Maintenance
// method; callers never see the store's types.
//
// Nothing here is for users. The types are internal to this module and
// change with it, in any release; keeping them here keeps the stores'
// public API to what users call.
//
// Work that must not run in two instances at once happens in a session
// ([PurgeSession]) holding the table's purge lock. New operations join Store,
// or a session, as methods: each store then implements them with its own SQL.
//
// [purge]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge
// [pgxinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox
// [sqlinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox
package maintenance

import (
	"context"
	"errors"
	"time"
)

// ErrReadOnly means the database refused a write: the user lacks the
// privilege, or the database or the connection is read-only (a replica, a
// SQLite file opened with mode=ro). Nothing was written.
var ErrReadOnly = errors.New("the database refused to write")

// ErrNoLeaseTable means the lease table beside the inbox table does not
// exist (a schema made before it, a role that could not create it): the
// middleware runs without the shared consumer check. The error carries the
// statement that creates the table.
var ErrNoLeaseTable = errors.New("the lease table does not exist")

// Store is an inbox table as its maintenance sees it.
type Store interface {
	// Table returns the inbox table's name as configured ("app.inbox").
	Table() string
	// Dialect names the database: "postgresql", "mysql" or "sqlite".
	Dialect() string
	// Partitioned reports whether the table is partitioned by time
	// (PostgreSQL, sqlinbox.Config.Partitioning): its purge then creates
	// and drops partitions, and every consumer's rows share a partition.
	Partitioned() bool
	// Limits returns the longest timeouts the database takes for the
	// statements of a session.
	Limits() Limits
	// BeginPurge opens a purge session. When another session holds the
	// table's purge lock it returns a nil session and that holder, without
	// waiting: that instance is already doing the work.
	BeginPurge(ctx context.Context) (PurgeSession, *Busy, error)
	// ClaimSQL returns the table's claim, for a store on another driver.
	ClaimSQL() ClaimSQL
	// DownSQL returns the statements that undo the schema, for a
	// migration tool's down step: dropTable drops the table, its
	// partitions and every claim, then the consumer registry (two
	// statements, separated by a semicolon and a newline);
	// dropFingerprint drops the fingerprint column.
	DownSQL() (dropTable, dropFingerprint string)

	// Stats counts the claims per consumer and reads the table's size and
	// partitions. Counting reads the whole table.
	Stats(ctx context.Context) (Stats, error)
	// Check compares the table with the store's configuration; on a
	// partitioned table it also wants the partitions of the next ahead
	// periods. A table that does not exist is a [TableCheck] with
	// [TableCheck.Exists] false, not an error.
	Check(ctx context.Context, ahead int) (TableCheck, error)
	// AddFingerprintColumn adds the fingerprint column to the table unless
	// it has one, and reports whether it added it.
	AddFingerprintColumn(ctx context.Context) (bool, error)
	// Consumers lists the consumers with claims, sorted.
	Consumers(ctx context.Context) ([]string, error)
	// Leases lists the leases of the processes that claim in the table,
	// sorted by consumer, service and instance; without a lease table, an
	// error wrapping [ErrNoLeaseTable].
	Leases(ctx context.Context) ([]Lease, error)
	// Claims lists the claims filter selects, sorted by processed_at,
	// then event id. It removes nothing.
	Claims(ctx context.Context, filter ClaimFilter) ([]Claim, error)
	// Forget removes consumer's claims of eventIDs, so that the next copy
	// of each event is processed again, and returns the claims it removed.
	// It waits for a claim of the same event in flight, as a claim would,
	// and a claim arriving meanwhile waits for it. Ids must be valid and
	// in canonical form (the store's CheckEventID). The claims come back
	// sorted as [Store.Claims] sorts them; on an error, those removed
	// before it. A refused write wraps [ErrReadOnly].
	Forget(ctx context.Context, consumer string, eventIDs []string) ([]Claim, error)
}

// Lease is one process's lease on a consumer: it claims for the consumer
// while its lease is renewed.
type Lease struct {
	Consumer, Service, Instance string
	// Warnings are what the process suspects of the consumer's wiring,
	// comma-separated.
	Warnings string
	// Age is how long ago the process last renewed it, by the database's
	// clock.
	Age time.Duration
	// Claiming is how long the process had been claiming at its last
	// renewal: from its first renewal to its last.
	Claiming time.Duration
}

// Limits are the longest timeouts a database takes for maintenance
// statements; a longer one would make every such statement fail, so
// callers refuse it in their configuration. Zero means no limit: the
// database does not use that timeout (SQLite neither; MySQL 8 no statement
// timeout).
type Limits struct {
	// StatementTimeout bounds the timeout of [PurgeSession.DeleteBatch]:
	// PostgreSQL's statement_timeout, MariaDB's max_statement_time.
	StatementTimeout time.Duration
	// LockTimeout bounds the lockTimeout of [PurgeSession.CreatePartitions]
	// and [PurgeSession.DropPartition]: PostgreSQL's lock_timeout.
	LockTimeout time.Duration
	// OneWriter: the database lets one writer at a time (SQLite), so every
	// claim waits behind a purge batch, not only those of its rows; the
	// purge's default batch is smaller there.
	OneWriter bool
}
