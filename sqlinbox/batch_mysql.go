package sqlinbox

import (
	"fmt"
	"strings"
	"time"
)

// batchQueries is the MySQL multi-row claim: the single claim's ON
// DUPLICATE KEY UPDATE with one row per event, in the given order. MySQL
// has no RETURNING, but the no-op update counts no row: the affected rows
// are the new claims, so a count of all or none says which, and a mixed
// count makes [Store.ClaimBatch] claim each id on its own. Not INSERT
// IGNORE, for the reason the single claim gives.
//
// Sorted ids are not enough on InnoDB: a duplicate's check takes a lock on
// the gap before the row too, where another batch's insert of a smaller id
// may land, and two batches then deadlock. The batches of one consumer on
// one table therefore claim one at a time, under a named lock (GET_LOCK,
// its name hashed to fit 64 characters) held for the claim statements only:
// a batch waits for no other batch's claims, and for at most
// [Config.ClaimTimeout] (else innodb_lock_wait_timeout) for the lock.
func (mysqlDialect) batchQueries(t tableName, c Config, _ queries) batchQueries {
	// processed_at written as the single claim writes it, in UTC whatever
	// the session's time zone.
	row := "(?, ?, UTC_TIMESTAMP(6))"
	if c.UUIDEventIDs {
		row = "(?, UNHEX(REPLACE(?, '-', '')), UTC_TIMESTAMP(6))"
	}
	head := fmt.Sprintf("INSERT INTO %s (consumer, event_id, processed_at) VALUES ", t.quoted('`'))
	if c.ClaimTimeout > 0 {
		head = fmt.Sprintf("SET STATEMENT innodb_lock_wait_timeout=%d FOR %s", int64((c.ClaimTimeout+time.Second-1)/time.Second), head)
	}
	name := fmt.Sprintf("CONCAT('watermill_inbox:', MD5(CONCAT(DATABASE(), '.%s:', ?)))", t)
	wait := "@@innodb_lock_wait_timeout"
	if c.ClaimTimeout > 0 {
		wait = fmt.Sprint(int64((c.ClaimTimeout + time.Second - 1) / time.Second))
	}
	return batchQueries{
		serialize: fmt.Sprintf("SELECT GET_LOCK(%s, %s)", name, wait),
		release:   fmt.Sprintf("DO RELEASE_LOCK(%s)", name),
		insert: func(n int) string {
			var b strings.Builder
			b.WriteString(head)
			for i := range n {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(row)
			}
			b.WriteString(" ON DUPLICATE KEY UPDATE processed_at = processed_at")
			return b.String()
		},
		args: func(consumer string, ids []string) ([]any, error) {
			args := make([]any, 0, 2*len(ids))
			for _, id := range ids {
				args = append(args, consumer, id)
			}
			return args, nil
		},
	}
}
