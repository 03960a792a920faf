package bench

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// PrefillIDTime makes sure inbox table, partitioned by the time inside
// event ids (sqlinbox.EventIDTime, UUID column), holds the claims of events
// 1..n for Consumer, with the UUIDv7 ids of PrefilledIDTime, their times
// spread over the days UTC days before the day the table was filled, one
// partition per period, as a table purged by dropping partitions holds
// them. It has the purge create the current partition and the ahead next
// ones. Like Prefill it inserts in chunks of a million rows and reuses an
// existing table; it returns the day it was filled, which PrefilledIDTime
// needs. PostgreSQL only.
func (a *Admin) PrefillIDTime(ctx context.Context, c sqlinbox.Config, n int64, days, ahead int, progress func(done int64)) (time.Time, error) {
	if a.d.dialect != sqlinbox.PostgreSQL {
		return time.Time{}, fmt.Errorf("time partitions are only available on PostgreSQL, not %s", a.d.dialect)
	}
	c.Dialect, c.PartitionKey, c.UUIDEventIDs = sqlinbox.PostgreSQL, sqlinbox.EventIDTime, true
	if err := a.CreateInbox(ctx, c); err != nil {
		return time.Time{}, err
	}
	// The fill day is kept in the table's comment, so that a later run
	// redelivers the very ids the table holds.
	var comment string
	if err := a.db.QueryRowContext(ctx, `SELECT COALESCE(obj_description(to_regclass($1), 'pg_class'), '')`, c.Table).Scan(&comment); err != nil {
		return time.Time{}, err
	}
	filledOn, err := time.Parse(time.DateOnly, comment)
	if err != nil {
		if filledOn, err = a.pastPartitions(ctx, c.Table, c.Partitioning, days); err != nil {
			return time.Time{}, err
		}
		if _, err := a.db.ExecContext(ctx, fmt.Sprintf(`COMMENT ON TABLE %s IS '%s'`, c.Table, filledOn.Format(time.DateOnly))); err != nil {
			return time.Time{}, err
		}
	}
	if err := a.partitionsAhead(ctx, c, ahead); err != nil {
		return time.Time{}, err
	}
	const chunk = 1_000_000
	filled := false
	for lo := int64(1); lo <= n; lo += chunk {
		hi := min(lo+chunk-1, n)
		var done int
		err := a.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+c.Table+` WHERE consumer = $1 AND event_id = $2`, Consumer, PrefilledIDTime(hi, filledOn, days)).Scan(&done)
		if err != nil {
			return time.Time{}, err
		}
		if done == 0 {
			// The SQL twin of PrefilledIDTime, sorted by time as ids
			// made over time would arrive.
			_, err := a.db.ExecContext(ctx, `INSERT INTO `+c.Table+` (consumer, event_id, event_time, processed_at)
SELECT $1, (substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(m, 1, 3) || '-8' || substr(m, 4, 3) || '-' || substr(m, 7, 12))::uuid, at, at
FROM (
	SELECT at, lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') AS h, md5(i::text) AS m
	FROM (SELECT i, $4::timestamptz - (1 + i % $5) * interval '1 day' + (i * 7919 % 86400) * interval '1 second' AS at
		FROM generate_series($2::bigint, $3::bigint) i) t
) s ORDER BY at ON CONFLICT DO NOTHING`, Consumer, lo, hi, filledOn, days)
			if err != nil {
				return time.Time{}, err
			}
			filled = true
		}
		if progress != nil {
			progress(hi)
		}
	}
	if filled {
		if _, err := a.db.ExecContext(ctx, `VACUUM ANALYZE `+c.Table); err != nil {
			return time.Time{}, err
		}
	}
	return filledOn, nil
}

// PrefilledIDTime is the UUIDv7 event id of row i of an inbox prefilled by
// PrefillIDTime on day filledOn: made on day 1 + i mod days before it, at a
// second of that day that depends on i, its random bits from md5(i).
func PrefilledIDTime(i int64, filledOn time.Time, days int) string {
	at := filledOn.AddDate(0, 0, -int(1+i%int64(days))).Add(time.Duration(i*7919%86400) * time.Second)
	h := fmt.Sprintf("%012x", at.UnixMilli())
	sum := md5.Sum(strconv.AppendInt(nil, i, 10))
	m := hex.EncodeToString(sum[:])
	return h[0:8] + "-" + h[8:12] + "-7" + m[0:3] + "-8" + m[3:6] + "-" + m[6:18]
}

// PrefilledIDTimeDuplicates redelivers random events among rows 1..n of an
// inbox prefilled by PrefillIDTime on day filledOn.
func PrefilledIDTimeDuplicates(n int64, filledOn time.Time, days int) Messages {
	return func(int) *message.Message {
		return message.NewMessage(PrefilledIDTime(1+rand.Int64N(n), filledOn, days), nil)
	}
}
