// Package maintenance is the seam between the inbox stores and the code that
// looks after an inbox table rather than claiming in it (package purge, the
// operator command), or claims in it through another driver with the
// store's SQL (pgxinbox). A store implements Store in its own package, next to
// its SQL (sqlinbox today), and hands it out through its one Maintenance
// method; callers never see the store's types.
//
// Nothing here is for users. The types are internal to this module and
// change with it, in any release; keeping them here keeps the stores'
// public API to what users call.
//
// Work that must not run in two instances at once happens in a session
// (PurgeSession) holding the table's maintenance lock on a connection of
// its own. New operations join Store, or a session, as methods: each store
// then implements them with its own SQL.
package maintenance

import (
	"context"
	"time"
)

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
	// table's purge lock it returns nil and false without waiting: that
	// instance is already doing the work.
	BeginPurge(ctx context.Context) (PurgeSession, bool, error)
	// ClaimSQL returns the table's claim, for a store on another driver.
	ClaimSQL() ClaimSQL
}

// Limits are the longest timeouts a database takes for maintenance
// statements; a longer one would make every such statement fail, so
// callers refuse it in their configuration. Zero means no limit: the
// database does not use that timeout (SQLite neither; MySQL 8 no statement
// timeout).
type Limits struct {
	// StatementTimeout bounds the timeout of PurgeSession.DeleteBatch:
	// PostgreSQL's statement_timeout, MariaDB's max_statement_time.
	StatementTimeout time.Duration
	// LockTimeout bounds the lockTimeout of PurgeSession.CreatePartitions
	// and DropPartition: PostgreSQL's lock_timeout.
	LockTimeout time.Duration
}
