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
// widest offset west of UTC a session can have (MySQL -13:59, MariaDB
// -12:59), by which a row written there looks older than it is. A row
// written east of UTC looks younger, and only stays longer.
const localTimeMargin = 14 * time.Hour

// sessionTimeDefault matches a default that writes the time of the
// writer's session time_zone, as the catalog spells it (MariaDB
// "current_timestamp(6)", MySQL "CURRENT_TIMESTAMP(6)", "now(6)").
var sessionTimeDefault = regexp.MustCompile(`(?i)current_(timestamp|time|date)|now\(|localtime|sysdate|curdate|curtime`)

// localTimes returns processed_at's default when it follows the writer's
// session, "" when it is UTC, a constant or none, and where the dialect's
// column cannot hold a local time (q.timeDefault is ""). Until the claim
// wrote UTC_TIMESTAMP(6) itself it left processed_at to the default, so on
// such a table (hand-made: CreateSchema's default is UTC_TIMESTAMP(6)) the
// rows claimed by those releases from a session west of UTC hold a time
// up to [localTimeMargin] behind UTC. Nothing in a row tells them from
// the claims written since, so the purge keeps every row of the table
// that much longer (widen) until the default is UTC.
func localTimes(ctx context.Context, db queryer, q maintenanceQueries) (string, error) {
	if q.timeDefault == "" {
		return "", nil
	}
	rows, err := db.QueryContext(ctx, q.timeDefault)
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
	if !sessionTimeDefault.MatchString(def.String) {
		return "", nil
	}
	return def.String, nil
}

// localTimesNote says what localTimes found, what the purge does about
// it, and when the migration that ends it is safe: once the rows an
// earlier release wrote west of UTC are older than the retention, a
// purge that takes them for up to 14 h older still deletes none inside
// it; rows written after the migration hold UTC, whatever the release.
func localTimesNote(t tableName, def string) string {
	return fmt.Sprintf("processed_at defaults to %s, the writer's session time: claims of releases before the claim wrote UTC_TIMESTAMP(6) itself may hold a time up to 14 h behind UTC and look that much older, so the purge keeps every row 14 h past its retention. "+
		"Migrate once the last claim an earlier release made from a session west of UTC is older than the retention (at once if there was none): ALTER TABLE %s MODIFY processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))",
		def, t.quoted('`'))
}

// widen returns scope with its retention longer by margin, at most the
// longest duration.
func widen(scope maintenance.PurgeScope, margin time.Duration) maintenance.PurgeScope {
	scope.OlderThan = time.Duration(min(int64(scope.OlderThan), math.MaxInt64-int64(margin))) + margin
	return scope
}
