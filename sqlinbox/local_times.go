package sqlinbox

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"regexp"
	"time"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// localTimeMargin is how long past its retention the purge keeps every row
// of a table whose processed_at default follows the writer's session: the
// widest offset a session can have on the side of UTC where a row written
// there looks older than it is (MySQL west to -13:59, MariaDB -12:59;
// PostgreSQL east to +14:00). A row written on the other side looks
// younger, and only stays longer.
const localTimeMargin = 14 * time.Hour

// localDefault is what a dialect knows of processed_at defaults that do
// not write UTC.
type localDefault struct {
	// query returns processed_at's default as the catalog spells it, no
	// row or NULL when it has none.
	query string
	// local matches a default whose time follows the writer's session.
	local *regexp.Regexp
	// side is where of UTC a writer's rows look older: "west" or "east".
	side string
	// migrate makes the default the schema's.
	migrate string
}

// mysqlLocalDefault matches a MySQL default that writes the time of the
// writer's session time_zone, as the catalog spells it (MariaDB
// "current_timestamp(6)", MySQL "CURRENT_TIMESTAMP(6)", "now(6)").
var mysqlLocalDefault = regexp.MustCompile(`(?i)current_(timestamp|time|date)|now\(|localtime|sysdate|curdate|curtime`)

// pgLocalDefault matches a PostgreSQL default that turns the instant into
// a wall-clock time in a zone of its own, which a timestamptz then reads
// in the writer's TimeZone: now() AT TIME ZONE 'UTC' is the instant minus
// the writer's offset. LOCALTIMESTAMP and ::timestamp casts use the
// writer's own zone both ways, and keep the instant.
var pgLocalDefault = regexp.MustCompile(`(?i)at time zone|timezone\(`)

// localTimes returns processed_at's default when it follows the writer's
// session, "" when it writes the instant (UTC), a constant or nothing, and
// where the dialect has no such defaults (q.timeDefault is nil). Until the
// claim wrote processed_at itself it left it to the default, so on such a
// table (hand-made: CreateSchema's default writes the instant) the rows
// claimed by those releases hold a time up to [localTimeMargin] off.
// Nothing in a row tells them from the claims written since, so the purge
// keeps every row of the table that much longer (widen) until the default
// writes the instant.
func localTimes(ctx context.Context, db queryer, q maintenanceQueries) (string, error) {
	if q.timeDefault == nil {
		return "", nil
	}
	rows, err := db.QueryContext(ctx, q.timeDefault.query)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var def sql.NullString
	if rows.Next() {
		if err := rows.Scan(&def); err != nil {
			return "", err
		}
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if !q.timeDefault.local.MatchString(def.String) {
		return "", nil
	}
	return def.String, nil
}

// localTimesNote says what localTimes found, what the purge does about
// it, and when the migration that ends it is safe: once the rows an
// earlier release wrote on the older-looking side of UTC are older than
// the retention, a purge that takes them for up to 14 h older still
// deletes none inside it; rows written after the migration hold the
// instant, whatever the release.
func localTimesNote(q maintenanceQueries, def string) string {
	return fmt.Sprintf("processed_at defaults to %s, the writer's session time: claims of releases before the claim wrote processed_at itself may hold a time up to 14 h off and look that much older, so the purge keeps every row 14 h past its retention. "+
		"Migrate once the last claim an earlier release made from a session %s of UTC is older than the retention (at once if there was none): %s",
		def, q.timeDefault.side, q.timeDefault.migrate)
}

// widen returns scope with its retention longer by margin, at most the
// longest duration.
func widen(scope maintenance.PurgeScope, margin time.Duration) maintenance.PurgeScope {
	scope.OlderThan = time.Duration(min(int64(scope.OlderThan), math.MaxInt64-int64(margin))) + margin
	return scope
}
