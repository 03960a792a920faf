package sqlinbox

import (
	"fmt"
	"strings"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// batchQueries is the PostgreSQL multi-row claim: the ids arrive as a
// VALUES list, $1 being the consumer, and the INSERT ... SELECT claims them
// in that list's order with ON CONFLICT DO NOTHING, RETURNING the new ones.
// A VALUES list rather than an array parameter: lib/pq, pgx's stdlib and
// native pgx all send strings the same way, and no driver's array type is
// needed.
//
// A table partitioned by processed_at takes the events' locks first, by a
// statement of their own, in the list's order, as the single claim does;
// then the insert looks for each pair in every partition.
func (postgresql) batchQueries(t tableName, c Config, _ queries) batchQueries {
	table := t.quoted('"')
	idType := "text"
	if c.UUIDEventIDs {
		idType = "uuid"
	}
	idTime := c.Partitioning != NoPartitioning && c.PartitionKey == EventIDTime
	locked := c.Partitioning != NoPartitioning && !idTime
	cols, sel, row, alias := "consumer, event_id", "$1::text, v.id::"+idType, "($%d::text)", "v(id)"
	if idTime {
		cols, sel, row, alias = cols+", event_time", sel+", v.at", "($%d::text, $%d::timestamptz)", "v(id, at)"
	}
	// processed_at written as the single claim writes it (pgClaimSQL).
	cols, sel = cols+", processed_at", sel+", now()"
	perRow := 1
	if idTime {
		perRow = 2
	}
	values := func(n int) string {
		var b strings.Builder
		b.WriteString("(VALUES ")
		for i := range n {
			if i > 0 {
				b.WriteString(", ")
			}
			p := 2 + i*perRow
			if idTime {
				fmt.Fprintf(&b, row, p, p+1)
			} else {
				fmt.Fprintf(&b, row, p)
			}
		}
		b.WriteString(") " + alias)
		return b.String()
	}
	bq := batchQueries{returning: true}
	if locked {
		// The timeout, when set, bounds the waits for the locks; the insert
		// then waits for nothing, and afterClaim restores the setting.
		bq.lock = func(n int) string {
			lock, from := "SELECT "+pgEventLock(t, "$1::text", "v.id")+" FROM ", values(n)
			if c.ClaimTimeout > 0 {
				lock, from = pgClaimTimeout(c.ClaimTimeout)+lock, "lt, "+from
			}
			// count(*) reads every row of l, so every lock is taken.
			return fmt.Sprintf(`WITH l AS (%s%s) SELECT current_setting('transaction_isolation') FROM (SELECT count(*) FROM l) c`, lock, from)
		}
		bq.insert = func(n int) string {
			return fmt.Sprintf(`INSERT INTO %[1]s (%[2]s) SELECT %[3]s FROM %[4]s
WHERE NOT EXISTS (SELECT 1 FROM %[1]s WHERE consumer = $1::text AND event_id = v.id::%[5]s)
ON CONFLICT DO NOTHING RETURNING event_id::text`, table, cols, sel, values(n), idType)
		}
	} else {
		bq.insert = func(n int) string {
			with, from := "", values(n)
			if c.ClaimTimeout > 0 {
				with, from = pgClaimTimeout(c.ClaimTimeout), "lt, "+from
			}
			return fmt.Sprintf(`%sINSERT INTO %s (%s) SELECT %s FROM %s ON CONFLICT DO NOTHING RETURNING event_id::text`, with, table, cols, sel, from)
		}
	}
	bq.args = func(consumer string, ids []string) ([]any, error) {
		args := make([]any, 1, 1+len(ids)*perRow)
		args[0] = consumer
		for _, id := range ids {
			args = append(args, id)
			if idTime {
				// ClaimBatch checked the ids with CheckEventID.
				at, err := inboxdriver.EventIDTime(id)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", inboxdriver.ErrInvalidEventID, err)
				}
				args = append(args, at)
			}
		}
		return args, nil
	}
	return bq
}
