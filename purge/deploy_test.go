package purge_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// A rolling deploy: every new instance calls CreateSchema while another
// purges. Round after round, with the coming partitions missing, blocked
// (today's rows already in the default partition) or present, CreateSchema
// and PurgeOnce run at once, on both partition keys, and neither fails.
// Before, on a table partitioned by event time, CreateSchema locked the
// default partition (its index) before the parent and the purge the
// reverse: "deadlock detected" in a few rounds of 40; and a partition the
// purge could not lock in time failed the round as an event in flight.
func TestCreateSchemaRacesThePurge(t *testing.T) {
	t.Parallel()
	for _, key := range []sqlinbox.PartitionKey{sqlinbox.ProcessedAt, sqlinbox.EventIDTime} {
		t.Run(key.String(), func(t *testing.T) {
			t.Parallel()
			c := func(c *sqlinbox.Config) { c.Partitioning, c.PartitionKey = sqlinbox.Daily, key }
			b := setup(t, postgres, c)
			p := b.purger(t, purge.Config{Retention: 3 * day, LockTimeout: 200 * time.Millisecond})
			cfg := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: b.table}
			c(&cfg)
			deploy, err := sqlinbox.New(testdb.Postgres(t, "pgx"), cfg)
			require.NoError(t, err)
			for round := range 100 {
				switch round % 3 {
				case 0, 1: // missing; then blocked by a row in the default partition
					if len(testdb.TimePartitions(t, b.db, b.table)) > 0 {
						testdb.DropTimePartitions(t, b.db, b.table)
					}
					if round%3 == 1 {
						b.seedAt(t, key, fmt.Sprintf("blocked-%d", round))
					}
				}
				var wg sync.WaitGroup
				errs := make(chan error, 2)
				wg.Go(func() { errs <- deploy.CreateSchema(context.Background()) })
				wg.Go(func() { _, err := p.PurgeOnce(context.Background()); errs <- err })
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err, "round %d", round+1)
				}
				_, err := b.db.Exec(`DELETE FROM ` + b.table)
				require.NoError(t, err)
			}
		})
	}
}

// seedAt inserts one row of now, by the table's partition key.
func (b *bundle) seedAt(t testing.TB, key sqlinbox.PartitionKey, id string) {
	t.Helper()
	if key == sqlinbox.EventIDTime {
		_, err := b.db.Exec(`INSERT INTO `+b.table+` (consumer, event_id, event_time) VALUES ('billing', $1, now())`, id)
		require.NoError(t, err)
		return
	}
	b.seed(t, "billing", id, 1, time.Minute)
}
