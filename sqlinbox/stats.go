package sqlinbox

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// Stats implements [maintenance.Store]. The counts per consumer read the
// whole table (no index covers them); the sizes and partition estimates
// come from the catalog.
func (m maintainer) Stats(ctx context.Context) (maintenance.Stats, error) {
	const doing = "reading the statistics of"
	q, err := m.queries()
	if err != nil {
		return maintenance.Stats{}, err
	}
	if err := m.checkLayout(ctx); err != nil {
		return maintenance.Stats{}, err
	}
	st := maintenance.Stats{TableBytes: -1, IndexBytes: -1}
	if st.Now, err = m.dbNow(ctx, q); err != nil {
		return st, m.fail(doing, err)
	}
	if st.Consumers, err = m.consumerStats(ctx, q); err != nil {
		return st, m.fail(doing, err)
	}
	var table, index sql.NullInt64
	if err := m.s.db.QueryRowContext(ctx, q.sizes).Scan(&table, &index); err != nil {
		return st, m.fail(doing, err)
	}
	if table.Valid {
		st.TableBytes = table.Int64
	}
	if index.Valid {
		st.IndexBytes = index.Int64
	}
	if q.partitions != "" && m.Partitioned() {
		if st.Partitions, err = m.partitionStats(ctx, q); err != nil {
			return st, m.fail(doing, err)
		}
	}
	return st, nil
}

func (m maintainer) consumerStats(ctx context.Context, q maintenanceQueries) ([]maintenance.ConsumerStats, error) {
	rows, err := m.s.db.QueryContext(ctx, q.consumerStats)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []maintenance.ConsumerStats
	for rows.Next() {
		var c maintenance.ConsumerStats
		var oldest, newest, oldestEvent, newestEvent string
		dest := []any{&c.Consumer, &c.Rows, &oldest, &newest, &c.LastHour, &c.LastDay}
		if m.s.q.idTime {
			dest = append(dest, &oldestEvent, &newestEvent)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		for _, tm := range []struct {
			text string
			to   *time.Time
		}{{oldest, &c.Oldest}, {newest, &c.Newest}, {oldestEvent, &c.OldestEvent}, {newestEvent, &c.NewestEvent}} {
			if tm.text == "" {
				continue // no event time: not a table partitioned by it
			}
			if *tm.to, err = parseTime(tm.text); err != nil {
				return nil, err
			}
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Byte order, the order of MySQL's binary consumer column, whatever
	// the database's collation.
	slices.SortFunc(out, func(a, b maintenance.ConsumerStats) int { return strings.Compare(a.Consumer, b.Consumer) })
	return out, nil
}

func (m maintainer) partitionStats(ctx context.Context, q maintenanceQueries) ([]maintenance.PartitionStats, error) {
	rows, err := m.s.db.QueryContext(ctx, q.partitions)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []maintenance.PartitionStats
	for rows.Next() {
		var p maintenance.PartitionStats
		if err := rows.Scan(&p.Name, &p.EstimatedRows, &p.Default); err != nil {
			return nil, err
		}
		if part, ok := parsePartition(m.s.table, p.Name); ok {
			p.Partition = part
		}
		p.EstimatedRows = max(p.EstimatedRows, -1)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Time partitions by time, then the others by name, the default last.
	slices.SortFunc(out, func(a, b maintenance.PartitionStats) int {
		switch {
		case a.Default != b.Default:
			if a.Default {
				return 1
			}
			return -1
		case a.From.IsZero() != b.From.IsZero():
			if a.From.IsZero() {
				return 1
			}
			return -1
		case !a.From.Equal(b.From):
			return a.From.Compare(b.From)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// Consumers implements [maintenance.Store].
func (m maintainer) Consumers(ctx context.Context) ([]string, error) {
	q, err := m.queries()
	if err != nil {
		return nil, err
	}
	rows, err := m.s.db.QueryContext(ctx, q.consumers)
	if err != nil {
		return nil, m.fail("listing the consumers of", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, m.fail("listing the consumers of", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, m.fail("listing the consumers of", err)
	}
	slices.Sort(out)
	return out, nil
}
