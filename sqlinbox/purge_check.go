package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// purgeCheckDialect is what a dialect knows about the shapes of a table
// whose times the purge would compare wrongly.
type purgeCheckDialect interface {
	// timeTypeProblem says why the purge refuses a time column of type
	// found (domains resolved) where want is needed, and how to migrate;
	// "" when the purge compares it as it compares want (a precision, a
	// domain), or when the type does not decide (SQLite: the values' form
	// does). conn is the purge's connection, whose session the purge's
	// comparisons run in.
	timeTypeProblem(ctx context.Context, conn *sql.Conn, t tableName, column, found, want string) (string, error)
	// foreignTimes, when not "", counts the rows whose time is not in the
	// form the purge compares and returns the smallest such value.
	foreignTimes(t tableName, column string) string
	// foreignTimesProblem says what foreignTimes found and how to migrate.
	foreignTimesProblem(t tableName, column string, n int64, example string) string
}

// purgeTimeColumn is the column the purge compares with its cutoff: the
// partition key on a partitioned table (rows are deleted from its default
// partition by it), processed_at on a plain one.
func purgeTimeColumn(c Config) string {
	if c.Partitioning != NoPartitioning {
		return c.PartitionKey.column()
	}
	return "processed_at"
}

// CheckTable implements [maintenance.PurgeSession] with the column checks of
// inbox check (Check's columns query and wanted types). It refuses a table
// only on proof that the purge would delete rows inside the retention; what
// it cannot read leaves the table unchecked ([maintenance.ErrUnchecked]).
func (p *purgeSession) CheckTable(ctx context.Context) error {
	md, ok := p.s.dialect.(maintenanceDialect)
	pc, checks := p.s.dialect.(purgeCheckDialect)
	if !ok || !checks {
		return nil
	}
	q := md.maintenanceQueries(p.s.table, p.s.config)
	cols, err := columns(ctx, p.conn, q)
	if err != nil {
		return p.unchecked(ctx, "reading the columns of", err)
	}
	if len(cols) == 0 {
		// Checked again next round, once it exists.
		return fmt.Errorf("sqlinbox: purging %s: the inbox table does not exist, run Store.CreateSchema or apply Store.SchemaSQL", p.s.table)
	}
	col := purgeTimeColumn(p.s.config)
	found, ok := typeOf(cols, col)
	if !ok {
		return fmt.Errorf("sqlinbox: purging %s: %w: it has no %s column, so it is not an inbox table this configuration describes (inbox check says what differs)", p.s.table, maintenance.ErrTableMismatch, col)
	}
	// Asked even of the wanted type: a MySQL DATETIME(6) holds UTC only
	// when its default or the session says so.
	problem, err := pc.timeTypeProblem(ctx, p.conn, p.s.table, col, found, q.wantColumns[col])
	if err != nil {
		return p.unchecked(ctx, "reading the time column of", err)
	}
	if problem != "" {
		return fmt.Errorf("sqlinbox: purging %s: %w: %s", p.s.table, maintenance.ErrTableMismatch, problem)
	}
	if query := pc.foreignTimes(p.s.table, col); query != "" {
		var (
			n       int64
			example sql.NullString
		)
		if err := p.conn.QueryRowContext(ctx, query).Scan(&n, &example); err != nil {
			return p.unchecked(ctx, "checking the times of", err)
		}
		if n > 0 {
			return fmt.Errorf("sqlinbox: purging %s: %w: %s", p.s.table, maintenance.ErrTableMismatch, pc.foreignTimesProblem(p.s.table, col, n, example.String))
		}
	}
	return nil
}

// unchecked wraps the error of a check that could not read what it needs
// with [maintenance.ErrUnchecked]; a cancelled context stays an error of
// the round.
func (p *purgeSession) unchecked(ctx context.Context, doing string, err error) error {
	if ctx.Err() != nil {
		return p.fail(ctx, doing, err)
	}
	return fmt.Errorf("sqlinbox: %s %s: %w: %w", doing, p.s.table, maintenance.ErrUnchecked, p.s.dialect.classify(err))
}

// pgTimestamptz matches timestamptz at any precision, as format_type
// spells it: the purge compares every one with now() alike.
var pgTimestamptz = regexp.MustCompile(`^timestamp(\([0-6]\))? with time zone$`)

func (postgresql) timeTypeProblem(_ context.Context, _ *sql.Conn, t tableName, column, found, want string) (string, error) {
	if pgTimestamptz.MatchString(found) {
		return "", nil
	}
	why := "the purge compares it with now() minus the retention"
	using := column + "::timestamptz"
	if strings.HasPrefix(found, "timestamp") && strings.HasSuffix(found, "without time zone") {
		why = "a timestamp without time zone is compared with now() in each session's TimeZone, so the purge's cutoff moves by the session's offset and rows inside the retention can go"
		using = column + " AT TIME ZONE 'UTC'"
	}
	return fmt.Sprintf("%s is %s, want %s: %s. Migrate (USING reads the values as UTC; name their zone if they were written in another): ALTER TABLE %s ALTER COLUMN %s TYPE timestamptz USING %s",
		column, found, want, why, t.quoted('"'), column, using), nil
}

func (postgresql) foreignTimes(tableName, string) string { return "" }

func (postgresql) foreignTimesProblem(tableName, string, int64, string) string { return "" }

// mysqlSessionUTC is true in a session whose time_zone is UTC all year
// (an offset, a named zone, or SYSTEM on a server in UTC): it reads a
// winter and a summer time as the UTC instants they spell.
var mysqlSessionUTC = fmt.Sprintf("UNIX_TIMESTAMP('2026-01-15 12:00:00') = %d AND UNIX_TIMESTAMP('2026-07-15 12:00:00') = %d",
	time.Date(2026, 1, 15, 12, 0, 0, 0, time.UTC).Unix(), time.Date(2026, 7, 15, 12, 0, 0, 0, time.UTC).Unix())

// mysqlDatetime matches DATETIME at any precision.
var mysqlDatetime = regexp.MustCompile(`^datetime(\([0-6]\))?$`)

// timeTypeProblem accepts what compares with UTC_TIMESTAMP(6) as the
// instant it holds: a DATETIME whose default is UTC_TIMESTAMP (the claims
// write the default), and, in a session at UTC, any DATETIME or TIMESTAMP
// (a TIMESTAMP reads back in the session's time_zone, a DATETIME written by
// NOW() holds it). Elsewhere a row looks older or younger by the session's
// offset: at -12:00 the purge deleted rows claimed moments ago.
func (d mysqlDialect) timeTypeProblem(ctx context.Context, conn *sql.Conn, t tableName, column, found, want string) (string, error) {
	datetime, timestamp := mysqlDatetime.MatchString(found), strings.HasPrefix(found, "timestamp")
	if !datetime && !timestamp {
		return fmt.Sprintf("%s is %s, want %s: the purge compares it with UTC_TIMESTAMP(6) minus the retention. Migrate: ALTER TABLE %s MODIFY %s DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), its values in UTC",
			column, found, want, t.quoted('`'), column), nil
	}
	var (
		def  sql.NullString
		utc  bool
		zone string
	)
	schema := "DATABASE()"
	if t.schema != "" {
		schema = "'" + t.schema + "'"
	}
	err := conn.QueryRowContext(ctx, fmt.Sprintf("SELECT (SELECT column_default FROM information_schema.columns WHERE table_schema = %s AND table_name = '%s' AND column_name = '%s'), %s, @@session.time_zone",
		schema, t.name, column, mysqlSessionUTC)).Scan(&def, &utc, &zone)
	if err != nil {
		return "", err
	}
	if utc || (datetime && strings.HasPrefix(strings.ToLower(def.String), "utc_timestamp")) {
		return "", nil
	}
	if timestamp {
		return fmt.Sprintf("%s is %s, read in the session's time_zone %s, not UTC, so rows look older or younger by its offset. Set time_zone='+00:00' in the DSN, or migrate in a UTC session: SET time_zone = '+00:00'; ALTER TABLE %s MODIFY %s DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
			column, found, zone, t.quoted('`'), column), nil
	}
	// Not "set time_zone in the DSN": the rows written so far would stay
	// in the old zone.
	return fmt.Sprintf("%s is %s with default %s, written in the session's time_zone %s, not UTC, so rows look older or younger by its offset. Migrate, claims stopped: UPDATE %s SET %s = CONVERT_TZ(%s, '%s', '+00:00'); ALTER TABLE %s MODIFY %s %s NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
		column, found, orNone(def.String), zone, t.quoted('`'), column, column, zone, t.quoted('`'), column, strings.ToUpper(found)), nil
}

func (mysqlDialect) foreignTimes(tableName, string) string { return "" }

func (mysqlDialect) foreignTimesProblem(tableName, string, int64, string) string { return "" }

// sqliteTimeGlob matches the one form of processed_at the purge compares:
// what the column's default writes, strftime('%Y-%m-%dT%H:%M:%fZ'). Text
// in that form sorts as the times it spells; text in another does not
// ("2026-12-01 10:26:00", from datetime('now'), sorts before every "T"
// time of its day).
const sqliteTimeGlob = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9].[0-9][0-9][0-9]Z"

// sqliteCanonicalTime is true for a processed_at in the purge's form.
func sqliteCanonicalTime(column string) string {
	return fmt.Sprintf("(typeof(%[1]s) = 'text' AND %[1]s GLOB '%[2]s')", column, sqliteTimeGlob)
}

// SQLite's column types are affinities: what decides is each value's form.
func (sqlite) timeTypeProblem(context.Context, *sql.Conn, tableName, string, string, string) (string, error) {
	return "", nil
}

// foreignTimes reads the processed_at index once through (0.5 to 0.8 s
// per million rows on two busy cores).
func (sqlite) foreignTimes(t tableName, column string) string {
	return fmt.Sprintf(`SELECT COUNT(*), MIN(CAST(%s AS TEXT)) FROM %s WHERE NOT %s`, column, t.quoted('"'), sqliteCanonicalTime(column))
}

func (sqlite) foreignTimesProblem(t tableName, column string, n int64, example string) string {
	rows := fmt.Sprintf("%d rows have", n)
	if n == 1 {
		rows = "1 row has"
	}
	return fmt.Sprintf("%s a %s the purge cannot compare, such as %q: it compares %s as text with strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now', ...), which sorts as time only in that form (\"2026-12-01 10:26:00\", from SQLite's datetime('now'), sorts before every \"T\" time of its day, so such a row would be deleted up to a day early; a Go time.Time stored as text is in its local zone). "+
		"Migrate the rows SQLite can read (UTC, or with an offset): UPDATE %s SET %s = strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', %s) WHERE NOT %s; it fails and changes nothing if some value is one SQLite cannot read, such as a Go time.Time written as text (\"2026-12-01 10:26:00.28 +0000 UTC\"): rewrite those from the program, as t.UTC().Format(\"2006-01-02T15:04:05.000Z\"); rows written by the inbox's own claims are already in the right form",
		rows, column, example, column, t.quoted('"'), column, column, sqliteCanonicalTime(column))
}
