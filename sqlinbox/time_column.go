package sqlinbox

import (
	"fmt"
	"regexp"
	"strings"
)

// timeColumnDialect is what a dialect knows about the types of a time
// column (processed_at, event_time) whose values the purge compares as the
// instants the claims wrote. [maintainer.Check] (inbox check) and the
// purge's table check both ask it, so that they accept and refuse the same
// types.
type timeColumnDialect interface {
	// timeTypeProblem says why a time column of type found (domains
	// resolved, lower case) cannot hold the claims' times where want is
	// the schema's, and how to migrate; "" when it holds them as want does
	// (a precision, a domain), or when the type does not decide (SQLite:
	// the values' form does).
	timeTypeProblem(t tableName, column, found, want string) string
}

// timeColumnProblem is d's timeTypeProblem, "" for a dialect that has none.
func timeColumnProblem(d Dialect, t tableName, column, found, want string) string {
	if tc, ok := d.(timeColumnDialect); ok {
		return tc.timeTypeProblem(t, column, found, want)
	}
	return ""
}

// pgTimestamptz matches timestamptz at any precision, as format_type
// spells it: the purge compares every one with now() alike.
var pgTimestamptz = regexp.MustCompile(`^timestamp(\([0-6]\))? with time zone$`)

// The claims write now(), an instant; a timestamptz keeps it whatever the
// session's TimeZone.
func (postgresql) timeTypeProblem(t tableName, column, found, want string) string {
	if pgTimestamptz.MatchString(found) {
		return ""
	}
	why := "the purge compares it with now() minus the retention"
	using := column + "::timestamptz"
	if strings.HasPrefix(found, "timestamp") && strings.HasSuffix(found, "without time zone") {
		why = "a timestamp without time zone holds now() in each writer's TimeZone, so rows look older or younger by its offset"
	}
	return fmt.Sprintf("%s is %s, want %s: %s. Migrate in a session at the writers' TimeZone (the server's default, unless they set another), in which USING reads the values: ALTER TABLE %s ALTER COLUMN %s TYPE timestamptz USING %s",
		column, found, want, why, t.quoted('"'), column, using)
}

// mysqlDatetime matches DATETIME at any precision.
var mysqlDatetime = regexp.MustCompile(`^datetime(\([0-6]\))?$`)

// The claims write UTC_TIMESTAMP(6), which a DATETIME keeps as written,
// whatever its default and the writer's session, and the purge compares
// with UTC_TIMESTAMP(6). A TIMESTAMP would take it for a time in the
// writer's session time_zone: at +09:00 a claim looks 9 hours old.
func (mysqlDialect) timeTypeProblem(t tableName, column, found, want string) string {
	if mysqlDatetime.MatchString(found) {
		return ""
	}
	migrate := fmt.Sprintf("ALTER TABLE %s MODIFY %s DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))", t.quoted('`'), column)
	if strings.HasPrefix(found, "timestamp") {
		return fmt.Sprintf("%s is %s, want %s: the claims write UTC_TIMESTAMP(6), which a TIMESTAMP converts from each writer's session time_zone, so rows look older or younger by its offset. Migrate in a UTC session: SET time_zone = '+00:00'; %s",
			column, found, want, migrate)
	}
	return fmt.Sprintf("%s is %s, want %s: the purge compares it with UTC_TIMESTAMP(6) minus the retention. Migrate: %s, its values in UTC", column, found, want, migrate)
}

// SQLite's column types are affinities, and the claims write text, which
// every affinity keeps as text: what decides is each value's form
// (foreignTimes).
func (sqlite) timeTypeProblem(tableName, string, string, string) string { return "" }
