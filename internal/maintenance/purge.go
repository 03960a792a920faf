package maintenance

import (
	"context"
	"errors"
	"time"
)

// ErrPurgeTimeout means one purge statement ran longer than the timeout
// given to PurgeSession.DeleteBatch (or, on SQLite, waited longer than the
// busy timeout for the write lock) and was cancelled; nothing of that batch
// was deleted. Package purge answers it with a smaller batch.
var ErrPurgeTimeout = errors.New("purge statement timed out")

// ErrTableMismatch means PurgeSession.CheckTable found the table in a shape
// the purge cannot compare times in: the wrong type for its time column, or
// (SQLite) rows whose time is text in another form. Nothing was deleted.
var ErrTableMismatch = errors.New("the purge refuses this table")

// PurgeScope selects the rows one purge pass removes: those whose
// processed_at is more than OlderThan before the database's clock (never the
// application's, so instances with skewed clocks agree), for one consumer or
// for every consumer but some.
type PurgeScope struct {
	// OlderThan is the retention: rows younger than this stay.
	OlderThan time.Duration
	// Consumer limits the pass to one consumer. When empty, the pass covers
	// every consumer not listed in Except.
	Consumer string
	// Except lists consumers the pass leaves alone (those with their own
	// retention). Ignored when Consumer is set.
	Except []string
}

// PurgeSession is one purge round on a dedicated connection that holds the
// table's purge lock, so that several instances running the purge never
// work at the same time. Close it to release the lock and the connection.
//
// The partition methods are for a partitioned table (Store.Partitioned);
// on a plain one they fail.
type PurgeSession interface {
	// CheckTable verifies, before anything is deleted, that the purge
	// compares the table's times correctly: the time column's type
	// (PostgreSQL timestamptz, MySQL DATETIME(6)), and on SQLite that every
	// row's time is text in the one form that sorts as time. A table that
	// fails returns an error wrapping ErrTableMismatch that says what is
	// wrong and how to migrate. It reads the catalog (on SQLite the
	// processed_at index, once through), so the purge runs it once.
	CheckTable(ctx context.Context) error

	// DeleteBatch deletes at most limit rows of scope, oldest first, in one
	// transaction, and returns how many it deleted. A statement running
	// longer than timeout (0: no limit) is cancelled by the database and
	// reported as an error wrapping ErrPurgeTimeout.
	DeleteBatch(ctx context.Context, scope PurgeScope, limit int, timeout time.Duration) (int64, error)
	// CountExpired returns, per consumer, how many rows of scope are old
	// enough for DeleteBatch to remove. It deletes nothing (a dry run).
	CountExpired(ctx context.Context, scope PurgeScope) (map[string]int64, error)

	// Partitions lists the time partitions of the table, oldest first.
	Partitions(ctx context.Context) ([]Partition, error)
	// CreatePartitions creates the partition of the current period (by the
	// database clock) and of the next ahead periods, skipping those that
	// exist, and returns those it created. A period whose rows already
	// went to the default partition cannot get its own partition; it is
	// returned in blocked, and its rows are purged from the default
	// partition by DeleteBatch. lockTimeout bounds the wait for the table
	// lock the DDL needs: claims queue behind that wait.
	CreatePartitions(ctx context.Context, ahead int, lockTimeout time.Duration) (created, blocked []Partition, err error)
	// MoveBlocked creates the partition of a period that CreatePartitions
	// returned as blocked, moving the default partition's rows of the
	// period into it, in one transaction that holds the table's exclusive
	// lock (claims wait for it; lockTimeout bounds the wait for the lock),
	// and returns how many rows it moved. Every claim stays: a copy of a
	// moved event is still a duplicate.
	MoveBlocked(ctx context.Context, part Partition, lockTimeout time.Duration) (moved int64, err error)
	// ExpiredPartitions returns the partitions whose every row is older
	// than olderThan by the database clock, oldest first.
	ExpiredPartitions(ctx context.Context, olderThan time.Duration) ([]Partition, error)
	// CountPartition returns, per consumer, the rows of one partition.
	CountPartition(ctx context.Context, part Partition) (map[string]int64, error)
	// DropPartition drops one partition with all its rows; lockTimeout
	// bounds the wait for the table lock it needs.
	DropPartition(ctx context.Context, part Partition, lockTimeout time.Duration) error

	// Close releases the purge lock and the connection.
	Close() error
}
