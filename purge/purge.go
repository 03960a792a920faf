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
	// unchecked: a round went on without the check, which could not read
	// what it needs, and said so (once); guarded by running.
	unchecked bool
	// widened: the rounds keep rows past the retention, said once;
	// guarded by running.
	widened bool
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
// without a restart. A check that cannot read what it needs (a catalog
// this user may not read) proves nothing wrong: the round goes on without
// it, said once per purger, and the next round tries again. So does a
// table whose default writes local times, whose rounds keep a margin.
func (p *Purger) checkTable(ctx context.Context, sess maintenance.PurgeSession) error {
	if p.checked {
		return nil
	}
	err := sess.CheckTable(ctx)
	switch {
	case err == nil:
		p.checked = true
	case errors.Is(err, maintenance.ErrLocalTimes):
		// Checked again next round: the margin ends with the migration.
		if !p.widened {
			p.widened = true
			p.config.Logger.Info("Inbox purge keeps rows 14h past the retention: processed_at's default writes local times", watermill.LogFields{"table": p.store.Table(), "reason": err.Error()})
		}
	case errors.Is(err, maintenance.ErrUnchecked):
		if !p.unchecked {
			p.unchecked = true
			p.config.Logger.Error("Inbox purge cannot check its table's time column; purging without the check", err, watermill.LogFields{"table": p.store.Table()})
		}
	default:
		return fmt.Errorf("purge: %w", err)
	}
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
