package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql" for the admin pool
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx" for the admin pool
	_ "modernc.org/sqlite"             // registers "sqlite"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Admin sets up and inspects the benchmark's tables on an uncounted
// connection, so that setup never shows up in the round trips measured.
type Admin struct {
	db *sql.DB
	d  *database
}

// database is what differs between the dialects for the benchmark's own
// tables.
type database struct {
	dialect   sqlinbox.Dialect
	sqlDriver string // database/sql driver name of the admin pool
	textType  string // the business tables' event id columns
	identity  string // the invoice table's generated bigint key
	createdAt string // the invoice table's creation time, set by the server
	truncate  string // statement prefix emptying one table
	ph        func(n int) string
	prefill   func(ctx context.Context, db *sql.DB, table string, lo, hi int64) error
}

var (
	postgresDB = &database{
		dialect: sqlinbox.PostgreSQL, sqlDriver: "pgx", textType: "text", truncate: "TRUNCATE ",
		identity:  "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
		createdAt: "timestamptz NOT NULL DEFAULT now()",
		ph:        func(n int) string { return fmt.Sprintf("$%d", n) },
		prefill: func(ctx context.Context, db *sql.DB, table string, lo, hi int64) error {
			_, err := db.ExecContext(ctx, `INSERT INTO `+table+` (consumer, event_id)
SELECT $1, md5(i::text)::uuid::text FROM generate_series($2::bigint, $3::bigint) i ORDER BY 2 ON CONFLICT DO NOTHING`, Consumer, lo, hi)
			return err
		},
	}
	mysqlDB = &database{
		dialect: sqlinbox.MySQL, sqlDriver: "mysql", textType: "VARCHAR(64)", truncate: "TRUNCATE TABLE ",
		identity:  "BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY",
		createdAt: "TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
		ph:        func(int) string { return "?" },
		// MariaDB's SEQUENCE engine numbers the rows.
		prefill: func(ctx context.Context, db *sql.DB, table string, lo, hi int64) error {
			_, err := db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, event_id)
SELECT ?, CONCAT_WS('-', SUBSTR(h, 1, 8), SUBSTR(h, 9, 4), SUBSTR(h, 13, 4), SUBSTR(h, 17, 4), SUBSTR(h, 21, 12))
FROM (SELECT MD5(seq) AS h FROM seq_%d_to_%d) s ORDER BY h ON DUPLICATE KEY UPDATE consumer = consumer`, table, lo, hi), Consumer)
			return err
		},
	}
	sqliteDB = &database{
		dialect: sqlinbox.SQLite, sqlDriver: "sqlite", textType: "TEXT", truncate: "DELETE FROM ",
		// The rowid, as an identity column would be.
		identity:  "INTEGER PRIMARY KEY",
		createdAt: "TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))",
		ph:        func(int) string { return "?" },
		prefill: func(ctx context.Context, db *sql.DB, table string, lo, hi int64) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // no-op after Commit
			stmt, err := tx.PrepareContext(ctx, `INSERT OR IGNORE INTO `+table+` (consumer, event_id) VALUES (?, ?)`)
			if err != nil {
				return err
			}
			for i := lo; i <= hi; i++ {
				if _, err := stmt.ExecContext(ctx, Consumer, PrefilledID(i)); err != nil {
					return err
				}
			}
			return tx.Commit()
		},
	}
)

// OpenAdmin connects the admin pool of d's database at dsn.
func OpenAdmin(ctx context.Context, d Driver, dsn string) (*Admin, error) {
	db, err := sql.Open(d.db.sqlDriver, dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("no %s answers at %s: %w", d.db.dialect, dsn, err)
	}
	return &Admin{db: db, d: d.db}, nil
}

// Close closes the admin pool.
func (a *Admin) Close() error { return a.db.Close() }

// CreateInbox creates the inbox table of c through the library, as users
// do; the dialect is the admin's.
func (a *Admin) CreateInbox(ctx context.Context, c sqlinbox.Config) error {
	c.Dialect = a.d.dialect
	s, err := sqlinbox.New(a.db, c)
	if err != nil {
		return err
	}
	return s.CreateSchema(ctx)
}

// Truncate empties tables.
func (a *Admin) Truncate(ctx context.Context, tables ...string) error {
	for _, t := range tables {
		if _, err := a.db.ExecContext(ctx, a.d.truncate+t); err != nil {
			return err
		}
	}
	return nil
}

// Drop drops tables if they exist.
func (a *Admin) Drop(ctx context.Context, tables ...string) error {
	for _, t := range tables {
		if _, err := a.db.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			return err
		}
	}
	return nil
}

// Prefill makes sure inbox table holds the claims of events 1..n for
// Consumer (ids from PrefilledID), inserting what is missing in chunks of a
// million rows, each sorted by key so that the index is written page by
// page instead of at random. An existing table is reused, so the expensive
// fill happens once.
func (a *Admin) Prefill(ctx context.Context, table string, n int64, progress func(done int64)) error {
	if err := a.CreateInbox(ctx, sqlinbox.Config{Table: table}); err != nil {
		return err
	}
	const chunk = 1_000_000
	filled := false
	for lo := int64(1); lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		var done int
		err := a.db.QueryRowContext(ctx, fmt.Sprintf(`SELECT COUNT(*) FROM %s WHERE consumer = %s AND event_id = %s`,
			table, a.d.ph(1), a.d.ph(2)), Consumer, PrefilledID(hi)).Scan(&done)
		if err != nil {
			return err
		}
		if done == 0 {
			if err := a.d.prefill(ctx, a.db, table, lo, hi); err != nil {
				return err
			}
			filled = true
		}
		if progress != nil {
			progress(hi)
		}
	}
	if filled && a.d.dialect == sqlinbox.PostgreSQL {
		// As a long-lived table would be: visibility map set, statistics.
		if _, err := a.db.ExecContext(ctx, `VACUUM ANALYZE `+table); err != nil {
			return err
		}
	}
	return nil
}

// WAL measures the WAL the benchmark's own transactions write, apart from
// every other session on the server.
type WAL struct {
	a       *Admin
	inspect bool // pg_walinspect is available
}

// WALMark is a position in the WAL.
type WALMark struct {
	lsn   string
	bytes int64
}

// WAL returns the WAL meter, or nil where the database has none
// (PostgreSQL only). With the pg_walinspect extension (created here when
// the role may) it counts only the records of transactions that touched
// tables, and splits full-page images from the rest; without it, it counts
// every byte the server wrote meanwhile.
func (a *Admin) WAL(ctx context.Context) *WAL {
	if a.d.dialect != sqlinbox.PostgreSQL {
		return nil
	}
	return &WAL{a: a, inspect: a.createWALInspect(ctx) == nil}
}

// createWALInspect creates pg_walinspect unless it exists. Concurrent
// CREATE EXTENSION IF NOT EXISTS calls race in the catalog (one fails with a
// unique violation on pg_extension_name_index), so callers take turns on a
// transaction-scoped advisory lock, as CreateSchema does.
func (a *Admin) createWALInspect(ctx context.Context) error {
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('watermill_inbox bench pg_walinspect'))`); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		return err
	}
	return tx.Commit()
}

// Mark returns the current position of the flushed WAL.
func (w *WAL) Mark(ctx context.Context) (WALMark, error) {
	var m WALMark
	err := w.a.db.QueryRowContext(ctx, `SELECT pg_current_wal_flush_lsn()::text, pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint`).Scan(&m.lsn, &m.bytes)
	return m, err
}

// Between returns the WAL written between from and to by transactions that
// wrote to tables (or their indexes): record bytes without full-page images,
// and the full-page images' bytes (0 and exact false without
// pg_walinspect: then records holds every byte the server wrote).
func (w *WAL) Between(ctx context.Context, from, to WALMark, tables ...string) (records, fpi int64, exact bool, err error) {
	if !w.inspect {
		return to.bytes - from.bytes, 0, false, nil
	}
	s, err := w.between(ctx, from, to, tables...)
	return s.records, s.fpi, true, err
}

// ErrWALUnreadable is returned by Between when pg_walinspect finds no
// record to start from after the first mark ("could not find a valid
// record after", seen on PostgreSQL 15 with the mark on a WAL page
// boundary): the sample is lost, and taking it again works.
var ErrWALUnreadable = errors.New("pg_walinspect found no record after the mark")

// walSplit is the WAL of the benchmark's transactions: records without
// full-page images (commit records included), the images, and the commit
// records alone.
type walSplit struct{ records, fpi, commit int64 }

// between reads the records between from and to with pg_walinspect.
func (w *WAL) between(ctx context.Context, from, to WALMark, tables ...string) (walSplit, error) {
	var s walSplit
	if to.bytes <= from.bytes { // nothing written, which pg_walinspect refuses to read
		return s, nil
	}
	// A transaction is ours when one of its records references a block of
	// our tables (the partitions of a partitioned one included); its commit
	// record then counts too.
	err := w.a.db.QueryRowContext(ctx, `
WITH RECURSIVE tabs AS (
	SELECT unnest($3::regclass[])::oid AS oid
	UNION SELECT i.inhrelid FROM pg_inherits i JOIN tabs t ON i.inhparent = t.oid
), rels AS (
	SELECT '/' || pg_relation_filenode(c.oid) || ' ' AS fn FROM pg_class c
	WHERE c.oid IN (SELECT oid FROM tabs) OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN (SELECT oid FROM tabs))
), recs AS (
	SELECT xid, resource_manager, record_type, record_length, fpi_length, block_ref FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)
), mine AS (
	SELECT DISTINCT r.xid FROM recs r JOIN rels ON strpos(r.block_ref, rels.fn) > 0 WHERE r.xid <> '0'
)
SELECT COALESCE(sum(record_length - fpi_length), 0)::bigint, COALESCE(sum(fpi_length), 0)::bigint,
	COALESCE(sum(record_length) FILTER (WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'), 0)::bigint
FROM recs WHERE xid IN (SELECT xid FROM mine)`, from.lsn, to.lsn, "{"+strings.Join(tables, ",")+"}").Scan(&s.records, &s.fpi, &s.commit)
	if err != nil && strings.Contains(err.Error(), "could not find a valid record after") {
		err = fmt.Errorf("%w: %w", ErrWALUnreadable, err)
	}
	return s, err
}

// PrefillPartitioned makes sure inbox table is partitioned by time (mode:
// sqlinbox.Daily or sqlinbox.Monthly) and holds the claims of events 1..n
// for Consumer (ids from PrefilledID), spread evenly over the days UTC days
// before today (event i on day i mod days), as a table purged by dropping
// partitions would hold them. It creates the partitions of those days, and,
// through the purge, the current one and the ahead next ones, so new claims
// land in a partition of their own and the default partition stays empty.
// Like Prefill it inserts in chunks of a million rows, each sorted by key,
// and reuses an existing table; on a later day the table still holds the
// same rows and the purge adds the new current partition. PostgreSQL only.
func (a *Admin) PrefillPartitioned(ctx context.Context, table string, mode sqlinbox.Partitioning, n int64, days, ahead int, progress func(done int64)) error {
	if a.d.dialect != sqlinbox.PostgreSQL {
		return fmt.Errorf("time partitions are only available on PostgreSQL, not %s", a.d.dialect)
	}
	if days < 1 {
		return fmt.Errorf("days: %d, want at least 1", days)
	}
	c := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: mode}
	if err := a.CreateInbox(ctx, c); err != nil {
		return err
	}
	today, err := a.pastPartitions(ctx, table, mode, days)
	if err != nil {
		return err
	}
	if err := a.partitionsAhead(ctx, c, ahead); err != nil {
		return err
	}
	const chunk = 1_000_000
	filled := false
	for lo := int64(1); lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		var done int
		err := a.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+` WHERE consumer = $1 AND event_id = $2`, Consumer, PrefilledID(hi)).Scan(&done)
		if err != nil {
			return err
		}
		if done == 0 {
			// Event i on day i mod days before today, at a second of the
			// day that also depends on i.
			_, err := a.db.ExecContext(ctx, `INSERT INTO `+table+` (consumer, event_id, processed_at)
SELECT $1, md5(i::text)::uuid::text, $4::timestamptz - (1 + i % $5) * interval '1 day' + (i * 7919 % 86400) * interval '1 second'
FROM generate_series($2::bigint, $3::bigint) i ORDER BY 2 ON CONFLICT DO NOTHING`, Consumer, lo, hi, today, days)
			if err != nil {
				return err
			}
			filled = true
		}
		if progress != nil {
			progress(hi)
		}
	}
	if filled {
		if _, err := a.db.ExecContext(ctx, `VACUUM ANALYZE `+table); err != nil {
			return err
		}
	}
	return nil
}

// pastPartitions creates the partitions of the days UTC days before today
// (or of their months), named as the purge names its own (table_pYYYYMMDD,
// or table_pYYYYMM) so that it lists and drops them, and returns the start
// of today by the database clock.
func (a *Admin) pastPartitions(ctx context.Context, table string, mode sqlinbox.Partitioning, days int) (time.Time, error) {
	var today time.Time
	if err := a.db.QueryRowContext(ctx, `SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&today); err != nil {
		return time.Time{}, err
	}
	today = today.UTC()
	var last time.Time
	for d := days; d >= 1; d-- {
		from, to, suffix := today.AddDate(0, 0, -d), today.AddDate(0, 0, -d+1), "20060102"
		if mode == sqlinbox.Monthly {
			from = time.Date(from.Year(), from.Month(), 1, 0, 0, 0, 0, time.UTC)
			to, suffix = from.AddDate(0, 1, 0), "200601"
		}
		if from.Equal(last) {
			continue // a month already created for an earlier day
		}
		last = from
		_, err := a.db.ExecContext(ctx, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s_p%s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
			table, from.Format(suffix), table, from.Format(time.RFC3339), to.Format(time.RFC3339)))
		if err != nil {
			return time.Time{}, fmt.Errorf("creating the partition of %s: %w", from.Format(time.DateOnly), err)
		}
	}
	return today, nil
}

// partitionsAhead has the purge create the current partition of c's table
// and the ahead next ones, as a purge running daily keeps them.
func (a *Admin) partitionsAhead(ctx context.Context, c sqlinbox.Config, ahead int) error {
	store, err := sqlinbox.New(a.db, c)
	if err != nil {
		return err
	}
	ps, busy, err := store.Maintenance().BeginPurge(ctx)
	if err != nil {
		return err
	}
	if busy != nil {
		return fmt.Errorf("%s: %s", c.Table, busy)
	}
	parts, err := ps.CreatePartitions(ctx, ahead, 10*time.Second)
	_ = ps.Close()
	if err != nil {
		return err
	}
	if len(parts.Blocked) > 0 || len(parts.TimedOut) > 0 {
		return fmt.Errorf("the partitions of %s were not all created (blocked by rows in the default partition: %v, table lock not granted: %v): drop the table to prefill it again", c.Table, parts.Blocked, parts.TimedOut)
	}
	return nil
}
