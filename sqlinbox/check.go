package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// Check implements [maintenance.Store]. It reads the catalog only, so a
// read-only user can run it.
func (m maintainer) Check(ctx context.Context, ahead int) (maintenance.TableCheck, error) {
	const doing = "checking"
	q, err := m.queries()
	if err != nil {
		return maintenance.TableCheck{}, err
	}
	partitioned, partKey := false, ""
	if q.kind != "" {
		var kind string
		err := m.s.db.QueryRowContext(ctx, q.kind).Scan(&kind)
		if errors.Is(err, sql.ErrNoRows) {
			return maintenance.TableCheck{}, nil
		}
		if err != nil {
			return maintenance.TableCheck{}, m.fail(doing, err)
		}
		kind, partKey, _ = strings.Cut(kind, " ")
		partitioned = kind == "p"
		partKey = strings.TrimSuffix(strings.TrimPrefix(partKey, "RANGE ("), ")")
	}
	cols, err := columns(ctx, m.s.db, q)
	if err != nil {
		return maintenance.TableCheck{}, m.fail(doing, err)
	}
	if len(cols) == 0 {
		return maintenance.TableCheck{}, nil
	}
	key, err := queryStrings(ctx, m.s.db, q.primaryKey)
	if err != nil {
		return maintenance.TableCheck{}, m.fail(doing, err)
	}
	leads, err := queryStrings(ctx, m.s.db, q.indexLeads)
	if err != nil {
		return maintenance.TableCheck{}, m.fail(doing, err)
	}
	c := maintenance.TableCheck{Exists: true}
	c.Findings = append(c.Findings, m.layoutFinding(partitioned, partKey), m.columnsFinding(q, cols), m.fingerprintFinding(q, cols))
	def, err := localTimes(ctx, m.s.db, q)
	if err != nil {
		return maintenance.TableCheck{}, m.fail(doing, err)
	}
	if def != "" {
		c.Findings = append(c.Findings, maintenance.Finding{Aspect: maintenance.AspectTimeDefault, OK: true, Found: def, Warning: localTimesNote(q, def)})
	}
	// The key of the table's own layout: a layout other than the
	// configuration's is reported once, above.
	wantKey := []string{"consumer", "event_id"}
	switch {
	case partitioned && partKey == EventIDTime.column():
		wantKey = []string{"consumer", "event_time", "event_id"}
	case partitioned:
		wantKey = append(wantKey, "processed_at")
	}
	c.Findings = append(c.Findings, maintenance.Finding{
		Aspect: maintenance.AspectPrimaryKey, OK: slices.Equal(key, wantKey),
		Found: orNone(strings.Join(key, ", ")), Want: strings.Join(wantKey, ", "),
	}, m.indexFinding(leads))
	if partitioned && m.Partitioned() {
		f, err := m.partitionsFinding(ctx, q, ahead)
		if err != nil {
			return maintenance.TableCheck{}, m.fail(doing, err)
		}
		c.Findings = append(c.Findings, f)
	}
	return c, nil
}

// indexFinding wants an index that leads with processed_at; leads are the
// first columns of the table's indexes. A table partitioned by [EventIDTime]
// needs none: its partitions are dropped by event time, and its primary
// key serves the oldest claim.
func (m maintainer) indexFinding(leads []string) maintenance.Finding {
	if m.s.q.idTime {
		return maintenance.Finding{Aspect: maintenance.AspectIndex, OK: true, Found: "not needed: partitions are dropped by event time"}
	}
	f := maintenance.Finding{Aspect: maintenance.AspectIndex, OK: slices.Contains(leads, "processed_at"), Found: "present"}
	if !f.OK {
		f.Found = "none; the indexes lead with " + orNone(strings.Join(leads, ", "))
		f.Want = "an index whose first column is processed_at"
	}
	return f
}

func (m maintainer) layoutFinding(partitioned bool, key string) maintenance.Finding {
	layout := func(p bool, key string) string {
		if p {
			return "partitioned by " + key
		}
		return "not partitioned"
	}
	want, wantKey := m.s.config.Partitioning != NoPartitioning, m.s.config.PartitionKey.column()
	f := maintenance.Finding{
		Aspect: maintenance.AspectLayout, OK: partitioned == want && (!want || key == wantKey),
		Found: layout(partitioned, key), Want: layout(want, wantKey),
	}
	if want {
		f.Want += " (" + m.s.config.Partitioning.String() + ")"
	}
	return f
}

// column is a column's name and type.
type column struct{ name, typ string }

func columns(ctx context.Context, db queryer, q maintenanceQueries) ([]column, error) {
	rows, err := db.QueryContext(ctx, q.columns)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []column
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.typ); err != nil {
			return nil, err
		}
		c.typ = strings.ToLower(c.typ)
		out = append(out, c)
	}
	return out, rows.Err()
}

func typeOf(cols []column, name string) (string, bool) {
	i := slices.IndexFunc(cols, func(c column) bool { return c.name == name })
	if i < 0 {
		return "", false
	}
	return cols[i].typ, true
}

// columnsFinding compares the claim's columns: three, event_time on a
// table partitioned by it, and the shard key column when there is one. A
// time column's type is judged as the purge judges it (timeColumnProblem).
func (m maintainer) columnsFinding(q maintenanceQueries, cols []column) maintenance.Finding {
	f := maintenance.Finding{Aspect: maintenance.AspectColumns, OK: true}
	var found, want []string
	names := []string{"consumer", "event_id", "processed_at"}
	if m.s.q.idTime {
		names = append(names, "event_time")
	}
	if sk := m.s.config.ShardKeyColumn; sk != "" {
		names = append(names, sk)
	}
	for _, name := range names {
		typ, ok := typeOf(cols, name)
		if !ok {
			typ = "missing"
		}
		switch name {
		case "processed_at", "event_time":
			f.OK = f.OK && ok && timeColumnProblem(m.s.dialect, m.s.table, name, typ, q.wantColumns[name]) == ""
		default:
			f.OK = f.OK && typ == q.wantColumns[name]
		}
		found = append(found, name+" "+typ)
		want = append(want, name+" "+q.wantColumns[name])
	}
	f.Found, f.Want = strings.Join(found, ", "), strings.Join(want, ", ")
	return f
}

// fingerprintFinding wants the fingerprint column when the configuration
// uses fingerprints; a column nobody uses is fine.
func (m maintainer) fingerprintFinding(q maintenanceQueries, cols []column) maintenance.Finding {
	typ, ok := typeOf(cols, "fingerprint")
	f := maintenance.Finding{Aspect: maintenance.AspectFingerprint, OK: true, Found: "none"}
	if ok {
		f.Found = "fingerprint " + typ
	}
	if m.s.config.Fingerprints {
		f.Want = "fingerprint " + q.wantColumns["fingerprint"]
		f.OK = f.Found == f.Want
	} else if ok {
		f.Found += " (unused: the configuration has no fingerprints)"
	}
	return f
}

// partitionsFinding wants the partitions of the next ahead periods, by the
// database clock, and the default partition. The current period's
// partition is not required: the purge deletes rows of the period from the
// default partition. A period of these without its partition whose rows
// the default partition already holds is listed as blocked: no purge can
// create its partition until they are moved
// ([maintenance.PurgeSession.MoveBlocked]).
func (m maintainer) partitionsFinding(ctx context.Context, q maintenanceQueries, ahead int) (maintenance.Finding, error) {
	f := maintenance.Finding{Aspect: maintenance.AspectPartitions}
	parts, err := timePartitions(ctx, m.s.db, m.s.table)
	if err != nil {
		return f, err
	}
	stats, err := m.partitionStats(ctx, q)
	if err != nil {
		return f, err
	}
	now, err := m.dbNow(ctx, q)
	if err != nil {
		return f, err
	}
	hasDefault := slices.ContainsFunc(stats, func(p maintenance.PartitionStats) bool { return p.Default })
	var missing []string
	for i := 0; i <= ahead; i++ {
		part := partitionFor(m.s.table, m.s.config.Partitioning, now, i)
		if covered(parts, part) {
			continue
		}
		if i > 0 {
			missing = append(missing, part.Name)
		}
		if hasDefault {
			b, err := blockedPeriod(ctx, m.s.db, m.s.table, m.s.config.PartitionKey, part)
			if err != nil {
				return f, err
			}
			if b.Rows > 0 {
				f.Blocked = append(f.Blocked, b)
			}
		}
	}
	f.OK = len(missing) == 0 && hasDefault
	f.Found = fmt.Sprintf("%d time partitions", len(parts))
	if len(parts) > 0 {
		f.Found += fmt.Sprintf(", %s to %s", parts[0].From.Format("2006-01-02"), parts[len(parts)-1].To.Format("2006-01-02"))
	}
	if !covered(parts, partitionFor(m.s.table, m.s.config.Partitioning, now, 0)) {
		f.Found += "; none for the current period (its rows go to the default partition)"
	}
	if hasDefault {
		f.Found += "; the default partition"
	}
	f.Want = fmt.Sprintf("the %d %s partitions ahead of the current one, and the default partition", ahead, m.s.config.Partitioning)
	if len(missing) > 0 {
		f.Want += "; missing " + strings.Join(missing, ", ")
	}
	if !hasDefault {
		f.Want += "; missing the default partition"
	}
	return f, nil
}

// AddFingerprintColumn implements [maintenance.Store]: only PostgreSQL can
// add a column IF NOT EXISTS, so the others look first.
func (m maintainer) AddFingerprintColumn(ctx context.Context) (bool, error) {
	const doing = "adding the fingerprint column to"
	q, err := m.queries()
	if err != nil {
		return false, err
	}
	cols, err := columns(ctx, m.s.db, q)
	if err != nil {
		return false, m.fail(doing, err)
	}
	if len(cols) == 0 {
		return false, fmt.Errorf("sqlinbox: %s %s: the table does not exist", doing, m.s.table)
	}
	if _, ok := typeOf(cols, "fingerprint"); ok {
		return false, nil
	}
	if _, err := m.s.db.ExecContext(ctx, m.s.q.addFingerprint); err != nil {
		return false, m.fail(doing, err)
	}
	return true, nil
}

func queryStrings(ctx context.Context, db queryer, query string) ([]string, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
