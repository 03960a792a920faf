package sqlinbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// partitioned refuses the partition commands on a plain table.
func (p *purgeSession) partitioned() error {
	if p.s.config.Partitioning == NoPartitioning {
		return fmt.Errorf("sqlinbox: %s is not partitioned (Config.Partitioning)", p.s.table)
	}
	return nil
}

// Partitions implements [maintenance.PurgeSession].
func (p *purgeSession) Partitions(ctx context.Context) ([]maintenance.Partition, error) {
	if err := p.partitioned(); err != nil {
		return nil, err
	}
	parts, err := timePartitions(ctx, p.conn, p.s.table)
	if err != nil {
		return nil, p.fail(ctx, "listing the partitions of", err)
	}
	return parts, nil
}

// CreatePartitions implements [maintenance.PurgeSession].
func (p *purgeSession) CreatePartitions(ctx context.Context, ahead int, lockTimeout time.Duration) (maintenance.Partitions, error) {
	if err := p.partitioned(); err != nil {
		return maintenance.Partitions{}, err
	}
	if err := p.checkLock(ctx); err != nil {
		return maintenance.Partitions{}, err
	}
	parts, err := makePartitions(ctx, p.conn, p.s.table, p.s.config, ahead, lockTimeout)
	if err != nil {
		err = p.fail(ctx, "creating partitions of", err)
	}
	return parts, err
}

// MoveBlocked implements [maintenance.PurgeSession]. The exclusive lock
// keeps claims out of the default partition while its rows of the period
// move: they park in a temporary table, the partition is created over the
// emptied range, and they go back through the parent into it. The columns
// are named, in the parent's order, so that a default partition whose
// columns are in another order (a fingerprint column added later) moves
// them right.
func (p *purgeSession) MoveBlocked(ctx context.Context, part maintenance.Partition, lockTimeout time.Duration) (int64, error) {
	if err := p.partitioned(); err != nil {
		return 0, err
	}
	if _, ok := parsePartition(p.s.table, part.Name); !ok {
		return 0, fmt.Errorf("sqlinbox: %q is not a time partition of %s", part.Name, p.s.table)
	}
	if err := p.checkLock(ctx); err != nil {
		return 0, err
	}
	moved, err := p.moveBlocked(ctx, part, lockTimeout)
	if err = pgDDLErr(err); errors.Is(err, maintenance.ErrLockTimeout) {
		return 0, fmt.Errorf("sqlinbox: moving the default partition's rows into partition %s of %s: %w", part.Name, p.s.table, err)
	}
	if err != nil {
		return 0, p.fail(ctx, "moving the default partition's rows into partition "+part.Name+" of", err)
	}
	return moved, nil
}

func (p *purgeSession) moveBlocked(ctx context.Context, part maintenance.Partition, lockTimeout time.Duration) (int64, error) {
	table, col := p.s.table.quoted('"'), p.s.config.PartitionKey.column()
	tx, err := p.conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	// The schema lock first, as every partition DDL takes it.
	if _, err := tx.ExecContext(ctx, pgSchemaLock(p.s.table)); err != nil {
		return 0, err
	}
	if err := pgSetLockTimeout(ctx, tx, lockTimeout); err != nil {
		return 0, err
	}
	var cols string
	for _, stmt := range []string{
		`LOCK TABLE ` + table + ` IN ACCESS EXCLUSIVE MODE`,
		`CREATE TEMPORARY TABLE watermill_inbox_moving (LIKE ` + table + `) ON COMMIT DROP`,
	} {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return 0, err
		}
	}
	if err := tx.QueryRowContext(ctx, `SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped`, table).Scan(&cols); err != nil {
		return 0, err
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf(`WITH moved AS (DELETE FROM %s WHERE %s >= $1 AND %s < $2 RETURNING %s) INSERT INTO watermill_inbox_moving (%s) SELECT %s FROM moved`,
		p.s.table.derived(defaultPartitionSuffix).quoted('"'), col, col, cols, cols, cols), part.From, part.To)
	if err != nil {
		return 0, err
	}
	moved, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	for _, stmt := range []string{
		createPartition(p.s.table, part),
		fmt.Sprintf(`INSERT INTO %s (%s) SELECT %s FROM watermill_inbox_moving`, table, cols, cols),
	} {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return 0, err
		}
	}
	return moved, tx.Commit()
}

// ExpiredPartitions implements [maintenance.PurgeSession].
func (p *purgeSession) ExpiredPartitions(ctx context.Context, olderThan time.Duration) ([]maintenance.Partition, error) {
	parts, err := p.Partitions(ctx)
	if err != nil {
		return nil, err
	}
	cutoff, err := p.dbTime(ctx, widen(maintenance.PurgeScope{OlderThan: olderThan}, p.margin).OlderThan)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(parts, func(part maintenance.Partition) bool { return part.To.After(cutoff) }), nil
}

// DropPartition implements [maintenance.PurgeSession]. It takes a brief
// exclusive lock on the table: PostgreSQL cannot detach a partition
// concurrently while a default partition exists.
func (p *purgeSession) DropPartition(ctx context.Context, part maintenance.Partition, lockTimeout time.Duration) error {
	if err := p.partitioned(); err != nil {
		return err
	}
	if _, ok := parsePartition(p.s.table, part.Name); !ok {
		return fmt.Errorf("sqlinbox: %q is not a time partition of %s", part.Name, p.s.table)
	}
	if err := p.checkLock(ctx); err != nil {
		return err
	}
	stmt := `DROP TABLE IF EXISTS ` + tableName{schema: p.s.table.schema, name: part.Name}.quoted('"')
	if err := pgDDL(ctx, p.conn, p.s.table, stmt, lockTimeout); err != nil {
		if errors.Is(err, maintenance.ErrLockTimeout) {
			return fmt.Errorf("sqlinbox: dropping partition %s of %s: %w", part.Name, p.s.table, err)
		}
		return p.fail(ctx, "dropping partition "+part.Name+" of", err)
	}
	return nil
}

// CountPartition implements [maintenance.PurgeSession].
func (p *purgeSession) CountPartition(ctx context.Context, part maintenance.Partition) (map[string]int64, error) {
	if _, ok := parsePartition(p.s.table, part.Name); !ok {
		return nil, fmt.Errorf("sqlinbox: %q is not a time partition of %s", part.Name, p.s.table)
	}
	rows, err := p.conn.QueryContext(ctx, `SELECT consumer, count(*) FROM `+tableName{schema: p.s.table.schema, name: part.Name}.quoted('"')+` GROUP BY consumer`)
	if err != nil {
		return nil, p.fail(ctx, "counting rows of partition "+part.Name+" of", err)
	}
	return scanCounts(rows)
}

// dbTime returns the database clock minus ago, in UTC.
func (p *purgeSession) dbTime(ctx context.Context, ago time.Duration) (time.Time, error) {
	at, err := pgNow(ctx, p.conn, ago)
	if err != nil {
		return time.Time{}, p.fail(ctx, "reading the clock of", err)
	}
	return at, nil
}
