// Package purge removes inbox rows once they are too old for a duplicate to
// still arrive, so the inbox table stops growing.
//
// A row may only go when no copy of its event can be delivered any more: the
// broker's retention (Kafka keeps topics 7 or 14 days by default, and an
// operator can replay them) plus every retry horizon in between. Purge a row
// earlier and the next copy of that event is processed again. The purge
// therefore refuses retentions below [Config.MinRetention] unless told
// otherwise.
//
// The work is bounded so live claims do not stall: rows are deleted oldest
// first in batches through the processed_at index, each statement under a
// timeout, with a short random pause between batches and smaller batches
// after a timeout. One instance purges at a time (a PostgreSQL advisory lock
// held by a transaction open for the round, or a MySQL named lock, each on
// a connection of its own, so the lock cannot outlive the round, even
// behind a transaction-pooling proxy or when the process is killed); the
// others skip the round, saying who holds the lock and since when. On a
// partitioned PostgreSQL table ([sqlinbox.Config.Partitioning]) the purge
// creates partitions ahead of time and drops whole expired partitions.
// Before its first delete a purger checks that the table's times compare
// correctly with its cutoff ([ErrTableMismatch]).
//
//	p, err := purge.New(store, purge.Config{Retention: 14 * 24 * time.Hour, Logger: logger})
//	go p.Run(ctx) // or: deleted, err := p.PurgeOnce(ctx) from cron (inbox purge, cmd/inbox)
//
// [sqlinbox.Config.Partitioning]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Config.Partitioning
package purge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
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

// ErrSkipped is returned by [Purger.PurgeOnce] and [Purger.DryRun] when
// another purge of the same table holds the purge lock (in this or another
// process). Nothing was done, and nothing needs doing: that purge is doing
// the work. [Purger.Run] and the inbox command (inbox purge) treat it as
// success. The error returned wraps it with the lock's holder and, where
// the database tells, how long it has held the lock.
//
// Test for it with [errors.Is]. Its type also has a method Skipped() bool
// that returns true, for code that must not import this package (and the
// store packages behind it): [prommetrics] finds it with [errors.As], as
// one finds [net.Error]'s Timeout.
//
// [prommetrics]: https://pkg.go.dev/github.com/watermill-inbox/inbox/prommetrics
var ErrSkipped error = skippedError{}

type skippedError struct{}

func (skippedError) Error() string { return "purge: another purge of this table is running; skipped" }

// Skipped reports that the round did nothing because another purge of the
// table was running.
func (skippedError) Skipped() bool { return true }

// ErrTableMismatch is returned by [Purger.PurgeOnce] and [Purger.DryRun],
// before anything is deleted, when the table's times cannot be compared
// correctly with the purge's cutoff: a time column of the wrong type (MySQL
// TIMESTAMP instead of DATETIME(6), PostgreSQL timestamp without time zone) or,
// on SQLite, rows whose processed_at is text in another form than the one the
// column's default writes. Purging such a table would delete rows still inside
// the retention. The error says what is wrong and how to migrate; a purger
// checks again each round until the table passes, then never again. Test for it
// with [errors.Is].
var ErrTableMismatch = maintenance.ErrTableMismatch

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

// Purger removes expired inbox rows from one table. Its methods are safe for
// concurrent use; concurrent rounds skip ([ErrSkipped]).
type Purger struct {
	store  maintenance.Store
	config Config
	scopes []maintenance.PurgeScope

	running sync.Mutex      // held by a round, so rounds in one process never overlap
	batch   int             // current batch size, shrunk after timeouts; guarded by running
	blocked map[string]bool // partitions reported blocked, logged as errors once; guarded by running
	checked bool            // the table passed CheckTable; guarded by running
}

// New validates config and returns a [Purger] for store's table. It does not
// touch the database.
func New(store Store, config Config) (*Purger, error) {
	var m maintenance.Store
	if store != nil {
		m = store.Maintenance() // nil for a nil *sqlinbox.Store
	}
	if m == nil {
		return nil, errors.New("purge: invalid config: store is nil")
	}
	config.setDefaults(m)
	if err := config.validate(m); err != nil {
		return nil, fmt.Errorf("purge: invalid config: %w", err)
	}
	p := &Purger{store: m, config: config, batch: config.BatchSize}
	overridden := slices.Sorted(maps.Keys(config.ConsumerRetention))
	for _, consumer := range overridden {
		p.scopes = append(p.scopes, maintenance.PurgeScope{OlderThan: config.ConsumerRetention[consumer], Consumer: consumer})
	}
	p.scopes = append(p.scopes, maintenance.PurgeScope{OlderThan: config.Retention, Except: overridden})
	return p, nil
}

// PurgeOnce runs one round: on a partitioned table it creates the coming
// partitions and drops expired ones, then it deletes expired rows in batches
// until none is left. It returns the rows removed (dropped partitions
// included), and [ErrSkipped] when another purge of the table is running.
func (p *Purger) PurgeOnce(ctx context.Context) (int64, error) {
	start := time.Now()
	n, err := p.purgeOnce(ctx)
	if p.config.OnRound != nil {
		p.config.OnRound(n, time.Since(start), err)
	}
	return n, err
}

func (p *Purger) purgeOnce(ctx context.Context) (int64, error) {
	if !p.running.TryLock() {
		p.logSkipped(nil)
		return 0, ErrSkipped
	}
	defer p.running.Unlock()
	sess, busy, err := p.store.BeginPurge(ctx)
	if err != nil {
		return 0, fmt.Errorf("purge: %w", err)
	}
	if busy != nil {
		p.logSkipped(busy)
		return 0, skipped(busy)
	}
	defer sess.Close() //nolint:errcheck // Close discards the connection when the unlock fails
	if err := p.checkTable(ctx, sess); err != nil {
		p.config.Logger.Error("Inbox purge round refused: nothing was deleted", err, watermill.LogFields{"table": p.store.Table()})
		return 0, err
	}

	start := time.Now()
	r := round{}
	var errs []error
	if p.store.Partitioned() {
		errs = append(errs, p.partitions(ctx, sess, &r))
	}
	for _, scope := range p.scopes {
		if err := p.deleteScope(ctx, sess, scope, &r); err != nil {
			errs = append(errs, err)
			break
		}
	}
	err = errors.Join(errs...)
	fields := watermill.LogFields{
		"table":        p.store.Table(),
		"rows_deleted": r.deleted,
		"batches":      r.batches,
		"timeouts":     r.timeouts,
		"duration":     time.Since(start).Round(time.Millisecond).String(),
	}
	if p.store.Partitioned() {
		fields["partitions_created"] = r.created
		fields["partitions_dropped"] = r.dropped
		fields["rows_dropped"] = r.droppedRows
	}
	if err != nil && ctx.Err() != nil {
		p.config.Logger.Info("Inbox purge round interrupted", fields)
		return r.deleted + r.droppedRows, err
	}
	if err != nil {
		p.config.Logger.Error("Inbox purge round failed", err, fields)
		return r.deleted + r.droppedRows, err
	}
	p.config.Logger.Info("Inbox purge round done", fields)
	return r.deleted + r.droppedRows, nil
}

// checkTable verifies the table before the purger's first delete; a table
// that fails is checked again next round, so a migration takes effect
// without a restart.
func (p *Purger) checkTable(ctx context.Context, sess maintenance.PurgeSession) error {
	if p.checked {
		return nil
	}
	if err := sess.CheckTable(ctx); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	p.checked = true
	return nil
}

// logSkipped logs a skipped round, with what the database tells of the
// round holding the lock (busy is nil for a round of this [Purger]).
func (p *Purger) logSkipped(busy *maintenance.Busy) {
	fields := watermill.LogFields{"table": p.store.Table()}
	if busy != nil {
		if busy.Known {
			fields["held_for"] = busy.HeldFor.Round(time.Second).String()
		}
		if busy.Holder != "" {
			fields["holder"] = busy.Holder
		}
	}
	p.config.Logger.Info("Inbox purge skipped: another purge of this table is running", fields)
}

// skipped is [ErrSkipped] saying who holds the lock and, where the database
// tells, for how long: a lock held for hours is a round stuck, not one
// under way.
func skipped(busy *maintenance.Busy) error {
	return fmt.Errorf("%w: %s", ErrSkipped, busy)
}

// round accumulates what one [Purger.PurgeOnce] did, for its log line.
type round struct {
	deleted, droppedRows int64
	batches, timeouts    int
	created, dropped     []string
}

// deleteScope deletes one scope's expired rows batch by batch until a batch
// comes back short.
func (p *Purger) deleteScope(ctx context.Context, sess maintenance.PurgeSession, scope maintenance.PurgeScope, r *round) error {
	for {
		n, err := sess.DeleteBatch(ctx, scope, p.batch, p.config.StatementTimeout)
		switch {
		case errors.Is(err, maintenance.ErrPurgeTimeout):
			r.timeouts++
			if p.batch <= MinBatchSize {
				return fmt.Errorf("purge: a batch of %d rows still timed out: %w", p.batch, err)
			}
			p.batch = max(p.batch/2, MinBatchSize)
			p.config.Logger.Info("Inbox purge batch timed out; smaller batches", watermill.LogFields{"table": p.store.Table(), "batch_size": p.batch})
		case err != nil:
			return fmt.Errorf("purge: %w", err)
		default:
			r.batches++
			r.deleted += n
			if p.config.OnBatch != nil {
				p.config.OnBatch(n)
			}
			if n < int64(p.batch) {
				return nil
			}
			// Grow back by an eighth per full batch: a timeout halves at
			// once, recovery takes several good batches.
			p.batch = min(p.batch+max(p.batch/8, 1), p.config.BatchSize)
		}
		if err := p.pause(ctx); err != nil {
			return err
		}
	}
}

func (p *Purger) pause(ctx context.Context) error {
	if p.config.BatchPause <= 0 {
		return ctx.Err()
	}
	half := p.config.BatchPause / 2
	d := half + rand.N(p.config.BatchPause-half+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// partitions keeps the coming partitions ready and drops the expired ones.
// A failure is reported, but the row deletes of the round still run.
func (p *Purger) partitions(ctx context.Context, sess maintenance.PurgeSession, r *round) error {
	parts, err := sess.CreatePartitions(ctx, p.config.PartitionsAhead, p.config.LockTimeout)
	for _, part := range parts.Created {
		r.created = append(r.created, part.Name)
	}
	p.reportBlocked(parts.Blocked, err == nil)
	for _, part := range parts.TimedOut {
		p.logLockTimeout("Inbox partition not created", part)
	}
	if err != nil {
		err = fmt.Errorf("purge: %w", err)
	}
	// Creating and dropping are independent: a table lock that times out
	// for one must not keep the other from happening.
	return errors.Join(err, p.dropExpired(ctx, sess, r))
}

// errPartitionBlocked is the error of the log line about a blocked
// partition.
var errPartitionBlocked = errors.New("the default partition holds rows of the partition's period")

// reportBlocked logs each partition that could not be created, as an
// error the first round it is seen (later rounds at info level), and,
// when the round created its partitions (complete), hands the list to
// [Config.OnPartitionsBlocked].
func (p *Purger) reportBlocked(blocked []maintenance.Partition, complete bool) {
	names := []string{}
	seen := map[string]bool{}
	for _, part := range blocked {
		names = append(names, part.Name)
		seen[part.Name] = true
		fields := watermill.LogFields{"table": p.store.Table(), "partition": part.Name}
		if p.blocked[part.Name] {
			p.config.Logger.Info("Inbox partition still not created: the default partition holds rows of its period", fields)
			continue
		}
		p.config.Logger.Error("Inbox partition not created: the default partition already holds rows of its period "+
			"(events dated ahead of the clock, on a table partitioned by event time; claims made while no partition covered it, on one partitioned by processed_at), "+
			"so every claim of the period lands there too, purged row by row. inbox check lists those rows; inbox schema -apply moves them into the partition", errPartitionBlocked, fields)
	}
	if !complete {
		maps.Copy(seen, p.blocked) // a partial list: forget none
	}
	p.blocked = seen
	if complete && p.config.OnPartitionsBlocked != nil {
		p.config.OnPartitionsBlocked(names)
	}
}

// dropExpired drops the partitions whose every row is past the retention.
// [Purger.PurgeOnce] reports their rows (counted just before the drop) as
// removed.
func (p *Purger) dropExpired(ctx context.Context, sess maintenance.PurgeSession, r *round) error {
	expired, err := sess.ExpiredPartitions(ctx, p.config.Retention)
	if err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	for _, part := range expired {
		counts, err := sess.CountPartition(ctx, part)
		if err != nil {
			return fmt.Errorf("purge: %w", err)
		}
		start := time.Now()
		err = sess.DropPartition(ctx, part, p.config.LockTimeout)
		if errors.Is(err, maintenance.ErrLockTimeout) {
			p.logLockTimeout("Inbox partition not dropped", part)
			continue
		}
		if err != nil {
			return fmt.Errorf("purge: %w", err)
		}
		var rows int64
		for _, n := range counts {
			rows += n
		}
		r.dropped = append(r.dropped, part.Name)
		r.droppedRows += rows
		if p.config.OnBatch != nil {
			p.config.OnBatch(rows)
		}
		p.config.Logger.Info("Inbox partition dropped", watermill.LogFields{"table": p.store.Table(), "partition": part.Name, "rows": rows, "duration": time.Since(start).String()})
	}
	return nil
}

// logLockTimeout logs partition DDL that gave up waiting for the table
// lock: not a failed round, the next one tries again.
func (p *Purger) logLockTimeout(what string, part maintenance.Partition) {
	p.config.Logger.Info(what+": the table lock was not granted within LockTimeout (a long transaction holds the table); the next round tries again", watermill.LogFields{
		"table": p.store.Table(), "partition": part.Name, "lock_timeout": p.config.LockTimeout.String(),
	})
}

// DryRun returns, per consumer, how many rows [Purger.PurgeOnce] would remove
// now, and removes nothing. It takes the purge lock like a round, so it returns
// [ErrSkipped] while another purge runs.
func (p *Purger) DryRun(ctx context.Context) (map[string]int64, error) {
	if !p.running.TryLock() {
		return nil, ErrSkipped
	}
	defer p.running.Unlock()
	sess, busy, err := p.store.BeginPurge(ctx)
	if err != nil {
		return nil, fmt.Errorf("purge: %w", err)
	}
	if busy != nil {
		return nil, skipped(busy)
	}
	defer sess.Close() //nolint:errcheck // nothing was written
	if err := p.checkTable(ctx, sess); err != nil {
		return nil, err
	}
	total := map[string]int64{}
	add := func(counts map[string]int64) {
		for c, n := range counts {
			total[c] += n
		}
	}
	if p.store.Partitioned() {
		expired, err := sess.ExpiredPartitions(ctx, p.config.Retention)
		if err != nil {
			return nil, fmt.Errorf("purge: %w", err)
		}
		for _, part := range expired {
			counts, err := sess.CountPartition(ctx, part)
			if err != nil {
				return nil, fmt.Errorf("purge: %w", err)
			}
			add(counts)
		}
	}
	for _, scope := range p.scopes {
		counts, err := sess.CountExpired(ctx, scope)
		if err != nil {
			return nil, fmt.Errorf("purge: %w", err)
		}
		add(counts)
	}
	return total, nil
}

// Run purges every [Config.Interval], starting at once, until ctx is done; then
// it returns nil. A failed round is logged and retried at the next interval;
// [ErrSkipped] rounds are normal when several instances run the purge.
func (p *Purger) Run(ctx context.Context) error {
	for {
		_, _ = p.PurgeOnce(ctx) // it logs its outcome; the next round retries
		t := time.NewTimer(p.config.Interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
