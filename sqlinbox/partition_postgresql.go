package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// defaultPartitionSuffix names the DEFAULT partition: it takes every row no
// time partition covers, so a claim never fails for want of a partition.
const defaultPartitionSuffix = "default"

// partitionedQueries is the PostgreSQL schema and claim of a table
// partitioned by processed_at.
//
// A unique key on a partitioned table must contain the partition key, so
// the primary key is (consumer, event_id, processed_at) and cannot see a
// duplicate whose original sits in another partition. The claim therefore
// serialises on the key itself: a transaction-scoped advisory lock on a hash
// of (consumer, event id), taken by its own statement first, then an insert
// that looks for the pair in every live partition. The lock must be its own
// statement: under READ COMMITTED each statement sees what was committed
// before it started, and only a statement started after the lock was granted
// sees the row of the transaction that held it. For the same reason the
// claim refuses REPEATABLE READ and SERIALIZABLE, whose snapshot is taken by
// the first statement, before the wait. A pipeline ([pgxinbox.Store]) may send
// both statements at once: each still takes its snapshot when the server
// reaches it, after the previous one finished.
//
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
func partitionedQueries(t tableName, c Config, idType, cols, fpCol, fpVal string) queries {
	table := t.quoted('"')
	// Advisory locks are database-wide: the key hashes the table's OID with
	// the pair, so tables sharing a database never wait for each other.
	// The OID, not the name: stores configured "inbox" and "public.inbox"
	// (or resolving "inbox" through search_path) must take the same lock,
	// or neither waits for the other and both insert. The cast resolves the
	// name as the claim's INSERT does. The length prefix keeps ("ab", "c")
	// apart from ("a", "bc").
	lock := "SELECT " + pgEventLock(t, "$1::text", "$2::text")
	if c.ClaimTimeout > 0 {
		lock = pgClaimTimeout(c.ClaimTimeout) + lock + " FROM lt"
	}
	lock = fmt.Sprintf(`WITH l AS (%s) SELECT current_setting('transaction_isolation') FROM l`, lock)
	q := queries{
		schema: []string{
			pgCreateTable(table, idType, fpCol, "consumer, event_id, processed_at", " PARTITION BY RANGE (processed_at)"),
			fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF %s DEFAULT`, t.derived(defaultPartitionSuffix).quoted('"'), table),
			fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s (processed_at)`, quoteName(t.derived("processed_at_idx").name, '"'), table),
			pgCreatePartitions(t, c),
		},
		schemaObjects: []tableName{t, t.derived(defaultPartitionSuffix), t.derived("processed_at_idx"), partitionsStep},
		// The primary key's (consumer, event_id) prefix makes the lookup
		// one index probe per partition. ON CONFLICT DO NOTHING still
		// guards the same-microsecond case the key does see.
		// processed_at is written, as pgInsertClaim says why.
		claim: fmt.Sprintf(`INSERT INTO %[1]s (%[3]s, processed_at)
SELECT $1::text, $2::%[2]s%[4]s, now()
WHERE NOT EXISTS (SELECT 1 FROM %[1]s WHERE consumer = $1::text AND event_id = $2::%[2]s)
ON CONFLICT DO NOTHING`, table, idType, cols, fpVal),
		beforeClaim: lock,
		checkBeforeClaim: func(isolation string) error {
			if isolation != "read committed" {
				return fmt.Errorf("sqlinbox: a partitioned inbox table needs READ COMMITTED claims, this transaction is %s: its snapshot predates the wait for the event's lock, so it could miss the claim it waited for", strings.ToUpper(isolation))
			}
			return nil
		},
	}
	if c.ClaimTimeout > 0 {
		q.afterClaim = pgRestoreLockTimeout
	}
	if c.Fingerprints {
		// The lock serialises copies of the event, so at most one
		// partition holds the pair.
		q.fingerprint = fmt.Sprintf(`SELECT fingerprint FROM %s WHERE consumer = $1 AND event_id = $2 LIMIT 1`, table)
	}
	q.verify = verifyLayout(t, c)
	return q
}

// verifyLayout checks, before the first claim, that the table is
// partitioned exactly when the [Config] says so, and by the Config's key. A
// table partitioned by processed_at claimed with the plain ON CONFLICT
// claim would let duplicates through, since its key includes processed_at.
func verifyLayout(t tableName, c Config) func(ctx context.Context, db *sql.DB, q queries) error {
	return func(ctx context.Context, db *sql.DB, _ queries) error { return checkLayout(ctx, db, t, c) }
}

func checkLayout(ctx context.Context, db rowQuerier, t tableName, c Config) error {
	var kind, key sql.NullString
	err := db.QueryRowContext(ctx, `SELECT relkind::text, pg_get_partkeydef(oid) FROM pg_class WHERE oid = to_regclass($1)`, t.quoted('"')).Scan(&kind, &key)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !kind.Valid) {
		return nil // no table yet: preparing the claim reports it
	}
	if err != nil {
		return fmt.Errorf("sqlinbox: checking the layout of %s: %w", t, PostgreSQL.classify(err))
	}
	partitioned := kind.String == "p"
	if partitioned != (c.Partitioning != NoPartitioning) {
		if partitioned {
			return fmt.Errorf("sqlinbox: %s is partitioned but Config.Partitioning is %s: set it to the table's layout, or duplicates in different partitions would not be detected", t, c.Partitioning)
		}
		return fmt.Errorf("sqlinbox: %s is not partitioned but Config.Partitioning is %s", t, c.Partitioning)
	}
	if want := "RANGE (" + c.PartitionKey.column() + ")"; partitioned && key.String != want {
		return fmt.Errorf("sqlinbox: %s is partitioned by %s but Config.PartitionKey is %s: set it to the table's key (sqlinbox.ProcessedAt or EventIDTime)", t, key.String, c.PartitionKey)
	}
	return nil
}

// partitionFor returns the partition of period i after the one holding at.
func partitionFor(t tableName, mode Partitioning, at time.Time, i int) maintenance.Partition {
	at = at.UTC()
	switch mode {
	case Monthly:
		from := time.Date(at.Year(), at.Month()+time.Month(i), 1, 0, 0, 0, 0, time.UTC)
		return maintenance.Partition{Name: t.name + "_p" + from.Format("200601"), From: from, To: from.AddDate(0, 1, 0)}
	default:
		from := time.Date(at.Year(), at.Month(), at.Day()+i, 0, 0, 0, 0, time.UTC)
		return maintenance.Partition{Name: t.name + "_p" + from.Format("20060102"), From: from, To: from.AddDate(0, 0, 1)}
	}
}

// parsePartition recognises the partitions this package creates, daily or
// monthly whatever the current mode, so a change of mode still drops the
// old ones. Other partitions are left alone.
func parsePartition(t tableName, name string) (maintenance.Partition, bool) {
	suffix, ok := strings.CutPrefix(name, t.name+"_p")
	if !ok {
		return maintenance.Partition{}, false
	}
	switch len(suffix) {
	case 8:
		from, err := time.Parse("20060102", suffix)
		if err == nil {
			return maintenance.Partition{Name: name, From: from, To: from.AddDate(0, 0, 1)}, true
		}
	case 6:
		from, err := time.Parse("200601", suffix)
		if err == nil {
			return maintenance.Partition{Name: name, From: from, To: from.AddDate(0, 1, 0)}, true
		}
	}
	return maintenance.Partition{}, false
}

// timePartitions lists the time partitions of t this package made, oldest
// first.
func timePartitions(ctx context.Context, db queryer, t tableName) ([]maintenance.Partition, error) {
	rows, err := db.QueryContext(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)`, t.quoted('"'))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []maintenance.Partition
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		if part, ok := parsePartition(t, name); ok {
			out = append(out, part)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b maintenance.Partition) int { return a.From.Compare(b.From) })
	return out, nil
}

// covered reports whether a partition of existing overlaps part's range.
func covered(existing []maintenance.Partition, part maintenance.Partition) bool {
	return slices.ContainsFunc(existing, func(e maintenance.Partition) bool { return e.From.Before(part.To) && part.From.Before(e.To) })
}

// makePartitions creates the missing partitions of the current period (by
// the database clock) and of the ahead next ones, for [Store.CreateSchema] and
// the purge alike. A period whose rows already went to the default partition is
// found by an index probe of that partition and left alone: trying would take
// the table's ACCESS EXCLUSIVE lock, queue every claim behind it, and fail.
// Each partition is created in a transaction of its own, which first takes the
// schema lock (so that instances creating the same partition take turns instead
// of colliding in the catalog, and every DDL takes its locks in one order:
// schema lock, then table) and then waits at most lockTimeout for the table
// lock; a period that times out is left for the next call.
func makePartitions(ctx context.Context, db conner, t tableName, c Config, ahead int, lockTimeout time.Duration) (maintenance.Partitions, error) {
	var out maintenance.Partitions
	existing, err := timePartitions(ctx, db, t)
	if err != nil {
		return out, err
	}
	now, err := pgNow(ctx, db, 0)
	if err != nil {
		return out, err
	}
	def, key := t.derived(defaultPartitionSuffix).quoted('"'), c.PartitionKey.column()
	for i := range ahead + 1 {
		part := partitionFor(t, c.Partitioning, now, i)
		if covered(existing, part) {
			continue
		}
		var blocked bool
		err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE %s >= $1 AND %s < $2)`, def, key, key), part.From, part.To).Scan(&blocked)
		if err != nil {
			return out, err
		}
		if blocked {
			out.Blocked = append(out.Blocked, part)
			continue
		}
		err = pgDDL(ctx, db, t, createPartition(t, part), lockTimeout)
		switch {
		case err == nil:
			out.Created = append(out.Created, part)
		case errors.Is(err, maintenance.ErrLockTimeout):
			out.TimedOut = append(out.TimedOut, part)
		case pgCode(err) == "23514": // check_violation: rows of the range reached the default partition meanwhile
			out.Blocked = append(out.Blocked, part)
		case pgCode(err) == "42P07": // duplicate_table: made meanwhile, by a migration tool's script
		default:
			return out, fmt.Errorf("creating partition %s: %w", part.Name, err)
		}
	}
	return out, nil
}

const pgTimestamp = "2006-01-02 15:04:05Z07:00"

// createPartition is the DDL of one time partition of t.
func createPartition(t tableName, part maintenance.Partition) string {
	return fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
		tableName{schema: t.schema, name: part.Name}.quoted('"'), t.quoted('"'),
		part.From.Format(pgTimestamp), part.To.Format(pgTimestamp))
}

// blockedPeriod reports how many rows of part's period the default
// partition holds (through the index on the partition key it has), with
// the first and last of their key: while it holds any, the partition
// cannot be created.
func blockedPeriod(ctx context.Context, db rowQuerier, t tableName, key PartitionKey, part maintenance.Partition) (maintenance.BlockedPeriod, error) {
	b := maintenance.BlockedPeriod{Partition: part}
	col := key.column()
	var first, last sql.NullString
	err := db.QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*), %s, %s FROM %s WHERE %s >= $1 AND %s < $2`,
		pgUTC("min("+col+")"), pgUTC("max("+col+")"), t.derived(defaultPartitionSuffix).quoted('"'), col, col),
		part.From, part.To).Scan(&b.Rows, &first, &last)
	if err != nil || b.Rows == 0 {
		return b, err
	}
	if b.First, err = parseTime(first.String); err != nil {
		return b, err
	}
	b.Last, err = parseTime(last.String)
	return b, err
}

// SchemaPartitionsAhead is how many partitions after the current period's
// [Store.CreateSchema] creates, as package purge's rounds do by default
// ([purge.DefaultPartitionsAhead]): claims land in time partitions from the
// first message, not in the default partition.
//
// [purge.DefaultPartitionsAhead]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge#DefaultPartitionsAhead
const SchemaPartitionsAhead = 3

// pgCreatePartitions is a DO block creating the partitions of the current
// period (by the database clock, in UTC) and of the [SchemaPartitionsAhead]
// next ones, named as partitionFor names them. It is the same text every
// day, so [Store.SchemaSQL] stays a fixed script. A partition the default
// partition holds rows of (check_violation) or that overlaps an existing
// one (invalid_object_definition, as after a change from monthly to daily)
// is left out: the purge reports it.
func pgCreatePartitions(t tableName, c Config) string {
	from, to, suffix := `(date_trunc('day', now() AT TIME ZONE 'UTC') + i * interval '1 day')::date`, `d + 1`, "YYYYMMDD"
	if c.Partitioning == Monthly {
		from, to, suffix = `(date_trunc('month', now() AT TIME ZONE 'UTC') + i * interval '1 month')::date`, `(d + interval '1 month')::date`, "YYYYMM"
	}
	name := fmt.Sprintf(`format('%%I', '%s_p' || to_char(d, '%s'))`, t.name, suffix)
	if t.schema != "" {
		name = fmt.Sprintf(`format('%%I.%%I', '%s', '%s_p' || to_char(d, '%s'))`, t.schema, t.name, suffix)
	}
	return fmt.Sprintf(`DO $$
DECLARE
	d date;
BEGIN
	FOR i IN 0..%d LOOP
		d := %s;
		BEGIN
			EXECUTE format('CREATE TABLE IF NOT EXISTS %%s PARTITION OF %s FOR VALUES FROM (%%L) TO (%%L)',
				%s, to_char(d, 'YYYY-MM-DD') || ' 00:00:00+00', to_char(%s, 'YYYY-MM-DD') || ' 00:00:00+00');
		EXCEPTION WHEN check_violation OR invalid_object_definition THEN
			NULL;
		END;
	END LOOP;
END $$`, SchemaPartitionsAhead, from, t.quoted('"'), name, to)
}

// partitionsStep stands in schemaObjects for the statement creating the
// coming time partitions.
var partitionsStep = tableName{}
