package sqlinbox

import (
	"fmt"
	"strings"
)

// batchQueries is the SQLite multi-row claim: one INSERT of every row, ?1
// being the consumer, ON CONFLICT DO NOTHING RETURNING the new ids (SQLite
// 3.35), processed_at written as the single claim writes it. The database's write lock, taken at BEGIN, serialises batches.
func (sqlite) batchQueries(t tableName, _ Config, _ queries) batchQueries {
	table := t.quoted('"')
	return batchQueries{
		returning: true,
		insert: func(n int) string {
			var b strings.Builder
			fmt.Fprintf(&b, `INSERT INTO %s (consumer, event_id, processed_at) VALUES `, table)
			for i := range n {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "(?1, ?%d, strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now'))", i+2)
			}
			b.WriteString(" ON CONFLICT DO NOTHING RETURNING event_id")
			return b.String()
		},
		args: consumerThenIDs,
	}
}

// consumerThenIDs are the parameters of a batch claim that names the
// consumer once.
func consumerThenIDs(consumer string, ids []string) ([]any, error) {
	args := make([]any, 1, 1+len(ids))
	args[0] = consumer
	for _, id := range ids {
		args = append(args, id)
	}
	return args, nil
}
