package maintenance

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrPurgeTimeout means one purge statement ran longer than the timeout
// given to [PurgeSession.DeleteBatch] (or, on SQLite, waited longer than the
// busy timeout for the write lock) and was cancelled; nothing of that batch
// was deleted. Package [purge] answers it with a smaller batch.
//
// [purge]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge
var ErrPurgeTimeout = errors.New("purge statement timed out")

// ErrTableMismatch means [PurgeSession.CheckTable] found the table in a shape
// the purge cannot compare times in: the wrong type for its time column, or
// (SQLite) rows whose time is text in another form. Nothing was deleted.
var ErrTableMismatch = errors.New("the purge refuses this table")

// ErrUnchecked means [PurgeSession.CheckTable] could not read what it needs
// (a catalog the user may not read): it proved nothing wrong, so the purge
// goes on without the check rather than stop retention.
var ErrUnchecked = errors.New("the purge could not check this table")

// ErrLocalTimes means [PurgeSession.CheckTable] found a time column whose
// default writes the writer's session time, so rows claimed while the claim
// left the column to its default may look older than they are: the session
// keeps every row that much past the retention, and the purge goes on.
var ErrLocalTimes = errors.New("the purge keeps this table's rows past the retention")

// ErrLockTimeout means DDL (creating or dropping a partition, creating the
// table's index) did not get its table lock within the lock timeout, so as
// not to keep claims queued behind it; nothing was changed. It is not
// [inbox.ErrInFlight], which is about a claim.
//
// [inbox.ErrInFlight]: https://pkg.go.dev/github.com/watermill-inbox/inbox#ErrInFlight
var ErrLockTimeout = errors.New("the table lock was not granted within the lock timeout (a long transaction holds the table; claims would have queued behind the wait)")

// Busy is another session holding a table's purge lock, as [Store.BeginPurge]
// finds it: that round is doing the work.
type Busy struct {
	// HeldFor is how long it has held the lock by the database clock, and
	// Known whether the database told (it may hide other users'
	// sessions).
	HeldFor time.Duration
	Known   bool
	// Holder names the session for an operator ("PostgreSQL backend
	// 4242", "MySQL connection 17"), or is empty.
	Holder string
}

func (b Busy) String() string {
	who := "another session"
	if b.Holder != "" {
		who = b.Holder
	}
	if !b.Known {
		return who + " holds the purge lock (the database does not tell this user since when)"
	}
	return fmt.Sprintf("%s has held the purge lock for %s", who, b.HeldFor.Round(time.Second))
}

// PurgeScope selects the rows one purge pass removes: those whose
// processed_at is more than OlderThan before the database's clock (never the
// application's, so instances with skewed clocks agree), for one consumer or
// for every consumer but some.
type PurgeScope struct {
	// OlderThan is the retention: rows younger than this stay.
	OlderThan time.Duration
	// Consumer limits the pass to one consumer. When empty, the pass covers
	// every consumer not listed in [PurgeScope.Except].
	Consumer string
	// Except lists consumers the pass leaves alone (those with their own
	// retention). Ignored when [PurgeScope.Consumer] is set.
	Except []string
}

// PurgeSession is one purge round on a dedicated connection, holding the
// table's purge lock so that several instances running the purge never
// work at the same time. The lock never outlives the round's connections,
// and no statement relies on session state left by another, so a session
// works behind a transaction-pooling proxy. Close it to release the lock
// and the connections.
//
// The partition methods are for a partitioned table ([Store.Partitioned]);
// on a plain one they fail.
type PurgeSession interface {
	// CheckTable verifies, before anything is deleted, that the purge
	// compares the table's times correctly: the time column's type
	// (PostgreSQL timestamptz of any precision, or a domain over it; MySQL
	// DATETIME of any precision), and on SQLite that every row's time is
	// text in the one form that sorts as time. It refuses only a table on
	// which the purge would delete rows inside the retention: the error
	// wraps [ErrTableMismatch] and says what is wrong and how to migrate.
	// When it cannot read what it needs, the error wraps [ErrUnchecked];
	// when the session keeps rows past the retention, [ErrLocalTimes]. It
	// reads the catalog (on SQLite the processed_at index, once through),
	// so the purge runs it once.
	CheckTable(ctx context.Context) error

	// DeleteBatch deletes at most limit rows of scope, oldest first, in one
	// transaction, and returns how many it deleted. A statement running
	// longer than timeout (0: no limit) is cancelled by the database and
	// reported as an error wrapping [ErrPurgeTimeout]. It first makes sure
	// the session still holds the purge lock, and fails if not.
	DeleteBatch(ctx context.Context, scope PurgeScope, limit int, timeout time.Duration) (int64, error)
	// CountExpired returns, per consumer, how many rows of scope are old
	// enough for [PurgeSession.DeleteBatch] to remove. It deletes nothing
	// (a dry run).
	CountExpired(ctx context.Context, scope PurgeScope) (map[string]int64, error)

	// Partitions lists the time partitions of the table, oldest first.
	Partitions(ctx context.Context) ([]Partition, error)
	// CreatePartitions creates the partition of the current period (by the
	// database clock) and of the next ahead periods, skipping those that
	// exist, and says what became of each missing one.
	CreatePartitions(ctx context.Context, ahead int, lockTimeout time.Duration) (Partitions, error)
	// MoveBlocked creates the partition of a period that
	// [PurgeSession.CreatePartitions] returned as blocked, moving the
	// default partition's rows of the period into it, in one transaction
	// that holds the table's exclusive lock (claims wait for it;
	// lockTimeout bounds the wait for the lock), and returns how many rows
	// it moved. Every claim stays: a copy of a moved event is still a
	// duplicate.
	MoveBlocked(ctx context.Context, part Partition, lockTimeout time.Duration) (moved int64, err error)
	// ExpiredPartitions returns the partitions whose every row is older
	// than olderThan by the database clock, oldest first.
	ExpiredPartitions(ctx context.Context, olderThan time.Duration) ([]Partition, error)
	// CountPartition returns, per consumer, the rows of one partition.
	CountPartition(ctx context.Context, part Partition) (map[string]int64, error)
	// DropPartition drops one partition with all its rows; lockTimeout
	// bounds the wait for the table lock it needs, after which it fails
	// with an error wrapping [ErrLockTimeout].
	DropPartition(ctx context.Context, part Partition, lockTimeout time.Duration) error

	// Close releases the purge lock and the connections.
	Close() error
}

// Partitions is what [PurgeSession.CreatePartitions] (or CreateSchema) made of
// the missing partitions of the periods it keeps ready.
type Partitions struct {
	Created []Partition
	// Blocked periods already have rows in the default partition, so they
	// cannot get a partition of their own (PostgreSQL refuses); their rows
	// are purged from the default partition by [PurgeSession.DeleteBatch].
	// Finding one costs an index probe, not the table lock.
	Blocked []Partition
	// TimedOut did not get the table lock within the lock timeout; the
	// next round (or the purge, after CreateSchema) tries again.
	TimedOut []Partition
}
