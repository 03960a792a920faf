package purge

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// Defaults of [Config].
const (
	// DefaultMinRetention is the shortest retention accepted without
	// [Config.AllowShortRetention]. A day covers redeliveries after a
	// crash, a rebalance or a relay retry; it does not cover a broker that
	// keeps messages for a week, so set [Config.Retention] from your
	// broker's retention.
	DefaultMinRetention = 24 * time.Hour
	// DefaultBatchSize is how many rows one DELETE removes at most: large
	// enough that a million rows take a few hundred statements, small enough
	// that each holds its row locks and WAL for milliseconds.
	DefaultBatchSize = 5000
	// DefaultSQLiteBatchSize replaces [DefaultBatchSize] on SQLite, whose
	// one write lock every claim waits for while a batch holds it: a batch
	// of 1,000 rows holds it for a few milliseconds, one of 5,000 for tens.
	DefaultSQLiteBatchSize = 1000
	// MinBatchSize is the smallest batch the purge shrinks to after
	// statement timeouts; a timeout at this size fails the round.
	MinBatchSize = 100
	// MaxBatchSize is the largest [Config.BatchSize] [New] takes, on every
	// dialect: ten times the default. A batch holds its row locks (on
	// SQLite the database's only write lock) and its undo or WAL until it
	// commits, and claims wait behind it; a larger one is the huge DELETE
	// the batches exist to avoid.
	MaxBatchSize = 50_000
	// DefaultStatementTimeout bounds one batch's DELETE.
	DefaultStatementTimeout = 10 * time.Second
	// DefaultBatchPause is the longest pause between two batches (the pause
	// is random between half of it and all of it), leaving the database
	// room for live claims.
	DefaultBatchPause = 100 * time.Millisecond
	// DefaultInterval is the time between two rounds of [Purger.Run].
	DefaultInterval = 10 * time.Minute
	// DefaultPartitionsAhead is how many future partitions a round keeps
	// ready on a partitioned table.
	DefaultPartitionsAhead = 3
	// DefaultLockTimeout bounds the wait for the table lock that creating
	// or dropping a partition needs; claims queue behind that wait.
	DefaultLockTimeout = time.Second
)

// Store is an inbox store the purge can maintain: a [*sqlinbox.Store] or a
// [*pgxinbox.Store]. Its method returns a type internal to this module, so
// only the library's stores implement it.
//
// [*sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [*pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type Store interface {
	Maintenance() maintenance.Store
}

// Config configures [New].
type Config struct {
	// Retention is how long a row is kept after its message was processed
	// (on a table partitioned by sqlinbox.EventIDTime: after the time inside
	// its event id).
	// It must exceed the longest time a copy of an event can still arrive:
	// the broker's retention plus retry horizons. Required: there is no
	// safe default, since it depends on your broker.
	Retention time.Duration

	// ConsumerRetention overrides [Config.Retention] for some consumers (by
	// consumer name); consumers not listed keep Retention. Each value is
	// checked against [Config.MinRetention] too. Not available on a
	// partitioned table, where a dropped partition takes every consumer's
	// rows. Defaults to none.
	ConsumerRetention map[string]time.Duration

	// MinRetention is the floor below which a retention is refused.
	// Defaults to [DefaultMinRetention].
	MinRetention time.Duration

	// AllowShortRetention accepts retentions below [Config.MinRetention],
	// for tests and for brokers that provably never redeliver after that
	// long. Defaults to false.
	AllowShortRetention bool

	// BatchSize is the most rows one DELETE removes, from [MinBatchSize] to
	// [MaxBatchSize]. Defaults to [DefaultBatchSize],
	// [DefaultSQLiteBatchSize] on SQLite.
	BatchSize int

	// StatementTimeout bounds each DELETE; after a timeout the batch is
	// halved (down to [MinBatchSize]) and grows back slowly. [New] refuses
	// one longer than the database takes: 2,147,483,647 ms on PostgreSQL, a
	// year on MariaDB (MySQL 8 and SQLite have no statement timeout for a
	// DELETE and ignore it; on SQLite a batch waits for the write lock as
	// long as the DSN's busy_timeout). Defaults to
	// [DefaultStatementTimeout].
	StatementTimeout time.Duration

	// BatchPause is the longest pause between batches. Defaults to
	// [DefaultBatchPause].
	BatchPause time.Duration

	// Interval is the time between rounds of [Purger.Run]. Defaults to
	// [DefaultInterval].
	Interval time.Duration

	// PartitionsAhead is how many partitions after the current one each
	// round creates on a partitioned table, so that rows rarely fall into
	// the default partition. Run the purge more often than that many
	// periods. Defaults to [DefaultPartitionsAhead].
	PartitionsAhead int

	// LockTimeout bounds the wait for the table lock when creating or
	// dropping a partition; a partition that times out is logged and
	// retried next round, without failing this one. At most
	// 2,147,483,647 ms (PostgreSQL's lock_timeout). Defaults to
	// [DefaultLockTimeout].
	LockTimeout time.Duration

	// OnRound, when set, is called after every round, Run's included, with
	// what [Purger.PurgeOnce] returns and how long it took: the hook for
	// metrics, such as a prommetrics.Metrics' ObservePurge with the table
	// bound. Defaults to nil.
	OnRound func(deleted int64, took time.Duration, err error)

	// OnPartitionsBlocked, when set, is called after every round on a
	// partitioned table that created its partitions, with the names of
	// those it could not create because the default partition already
	// holds rows of their period (none: an empty slice), such as
	// events dated ahead of the clock on a table partitioned by event
	// time: the hook for an alert, such as a prommetrics.Metrics'
	// PartitionsBlocked with the table bound. Until someone moves those
	// rows (inbox schema -apply, see inbox check), every claim of such a
	// period lands in the default partition, purged row by row. Defaults
	// to nil.
	OnPartitionsBlocked func(partitions []string)

	// OnBatch, when set, is called after each batch of deletes and each
	// dropped partition, with the rows it removed, from the goroutine
	// running the round, which waits for it: the hook for a progress
	// display, such as the inbox command's on a terminal. Defaults to nil.
	OnBatch func(deleted int64)

	// Logger receives one line per round (rows deleted, duration,
	// partitions created and dropped) and errors of Run's rounds.
	// Defaults to [watermill.NopLogger].
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults(store maintenance.Store) {
	if c.MinRetention == 0 {
		c.MinRetention = DefaultMinRetention
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
		if store.Limits().OneWriter {
			c.BatchSize = DefaultSQLiteBatchSize
		}
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = DefaultStatementTimeout
	}
	if c.BatchPause == 0 {
		c.BatchPause = DefaultBatchPause
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.PartitionsAhead == 0 {
		c.PartitionsAhead = DefaultPartitionsAhead
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = DefaultLockTimeout
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

func (c Config) validate(store maintenance.Store) error {
	if c.Retention == 0 {
		return errors.New("Retention is required: set it longer than the time a duplicate can still arrive (broker retention plus retries)")
	}
	if err := c.checkRetention("Retention", c.Retention); err != nil {
		return err
	}
	if len(c.ConsumerRetention) > 0 && store.Partitioned() {
		return errors.New("ConsumerRetention: not available on a partitioned table, where dropping a partition removes every consumer's rows")
	}
	for _, consumer := range slices.Sorted(maps.Keys(c.ConsumerRetention)) {
		if consumer == "" {
			return errors.New("ConsumerRetention: empty consumer name")
		}
		if err := c.checkRetention(fmt.Sprintf("ConsumerRetention[%q]", consumer), c.ConsumerRetention[consumer]); err != nil {
			return err
		}
	}
	if c.MinRetention < 0 {
		return fmt.Errorf("MinRetention is negative (%s)", c.MinRetention)
	}
	if c.BatchSize < MinBatchSize {
		return fmt.Errorf("BatchSize %d is below MinBatchSize (%d)", c.BatchSize, MinBatchSize)
	}
	if c.BatchSize > MaxBatchSize {
		return fmt.Errorf("BatchSize %d is above MaxBatchSize (%d): one DELETE that large holds its locks, and the claims waiting behind them, for as long as it runs", c.BatchSize, MaxBatchSize)
	}
	for name, d := range map[string]time.Duration{"StatementTimeout": c.StatementTimeout, "BatchPause": c.BatchPause, "Interval": c.Interval, "LockTimeout": c.LockTimeout} {
		if d < 0 {
			return fmt.Errorf("%s is negative (%s)", name, d)
		}
	}
	limits := store.Limits()
	for _, l := range []struct {
		name     string
		d, limit time.Duration
	}{{"StatementTimeout", c.StatementTimeout, limits.StatementTimeout}, {"LockTimeout", c.LockTimeout, limits.LockTimeout}} {
		if l.limit > 0 && l.d > l.limit {
			return fmt.Errorf("%s %s is above %s, the longest the %s database takes", l.name, l.d, l.limit, store.Dialect())
		}
	}
	if c.PartitionsAhead < 0 {
		return fmt.Errorf("PartitionsAhead is negative (%d)", c.PartitionsAhead)
	}
	return nil
}

func (c Config) checkRetention(field string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s must be positive, got %s", field, d)
	}
	if d < c.MinRetention && !c.AllowShortRetention {
		return fmt.Errorf("%s %s is below MinRetention %s: rows purged before every copy of their event has arrived let that copy be processed again; keep rows for the broker's retention plus retries, or set AllowShortRetention", field, d, c.MinRetention)
	}
	return nil
}
