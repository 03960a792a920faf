package purge

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

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
		// Events dated ahead of the clock (partitioned by event time), or
		// claims made while no partition covered the period (by
		// processed_at): every claim of the period lands there too.
		p.config.Logger.Error("Inbox partition not created: the default partition holds rows of its period; inbox check lists them, inbox schema -apply moves them", errPartitionBlocked, fields)
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
