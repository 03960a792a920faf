package sqlinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

func partitionedStore(t *testing.T, driver string, mode sqlinbox.Partitioning) (*sql.DB, *sqlinbox.Store, string) {
	t.Helper()
	db := testdb.Postgres(t, driver)
	table := testdb.Table(t, db, "inbox_part")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: mode})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	t.Cleanup(func() { _ = store.Close() })
	return db, store, table
}

// createPartition makes the daily partition holding the database's now()
// minus ago, as the purge would have made it back then.
func createPartition(t testing.TB, db *sql.DB, table string, ago time.Duration) string {
	t.Helper()
	var from time.Time
	require.NoError(t, db.QueryRow(`SELECT date_trunc('day', (now() - $1::float8 * interval '1 microsecond') AT TIME ZONE 'UTC')`, ago.Microseconds()).Scan(&from))
	name := table + "_p" + from.Format("20060102")
	_, err := db.Exec(fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s+00') TO ('%s+00')`,
		name, table, from.Format(time.DateTime), from.AddDate(0, 0, 1).Format(time.DateTime)))
	require.NoError(t, err)
	return name
}

// partitionOf returns the partition holding (consumer, eventID).
func partitionOf(t *testing.T, db *sql.DB, table, consumer, eventID string) string {
	t.Helper()
	var name string
	require.NoError(t, db.QueryRow(fmt.Sprintf(`SELECT tableoid::regclass::text FROM %s WHERE consumer = $1 AND event_id = $2`, table), consumer, eventID).Scan(&name))
	return name
}

func claimOnce(t *testing.T, store *sqlinbox.Store, consumer, eventID string) bool {
	t.Helper()
	tx, ok, err := claim(context.Background(), store, nil, consumer, eventID)
	require.NoError(t, err)
	if ok {
		require.NoError(t, tx.Commit())
	}
	return ok
}

// The primary key of a partitioned table includes processed_at, so it cannot
// see a duplicate whose original lives in another partition. The claim must
// still find it: claim an event, move its row across the partition
// boundary (as time passing would), deliver it again.
func TestPartitionedDuplicateAcrossPartitions(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, store, table := partitionedStore(t, driver, sqlinbox.Daily)
			today := table + "_p" + dbNow(t, db).Format("20060102") // made by CreateSchema
			old := createPartition(t, db, table, 5*24*time.Hour)

			require.True(t, claimOnce(t, store, "billing", "ev-1"))
			require.Equal(t, today, partitionOf(t, db, table, "billing", "ev-1"))
			require.False(t, claimOnce(t, store, "billing", "ev-1"), "same partition")

			// Five days pass: the row now sits in an older partition, and a
			// new claim would land in today's.
			_, err := db.Exec(fmt.Sprintf(`UPDATE %s SET processed_at = processed_at - interval '5 days' WHERE event_id = 'ev-1'`, table))
			require.NoError(t, err)
			require.Equal(t, old, partitionOf(t, db, table, "billing", "ev-1"))
			require.False(t, claimOnce(t, store, "billing", "ev-1"), "a duplicate whose original is in another partition must be detected")
			require.True(t, claimOnce(t, store, "other-consumer", "ev-1"))

			// An original that went to the default partition is found too.
			_, err = db.Exec(fmt.Sprintf(`INSERT INTO %s (consumer, event_id, processed_at) VALUES ('billing', 'ev-2', now() - interval '40 days')`, table))
			require.NoError(t, err)
			require.Equal(t, table+"_default", partitionOf(t, db, table, "billing", "ev-2"))
			require.False(t, claimOnce(t, store, "billing", "ev-2"))

			var n int
			require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&n))
			require.Equal(t, 3, n)
		})
	}
}

// Racing deliveries of one event on a partitioned table: one winner, even
// though the key cannot arbitrate (every claim's processed_at differs).
func TestPartitionedRacingClaimsOneWinner(t *testing.T) {
	t.Parallel()
	db, store, table := partitionedStore(t, "pgx", sqlinbox.Daily)
	const events, racers = 5, 12
	testdb.RaceClaims(t, events, racers, func(id string) (func() error, bool, error) {
		tx, ok, err := claim(context.Background(), store, nil, "billing", id)
		if !ok {
			return nil, false, err
		}
		return tx.Commit, true, nil
	})
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&n))
	require.Equal(t, events, n)
}

// A snapshot taken before the wait for the event's lock could miss the claim
// it waited for, so partitioned claims refuse REPEATABLE READ.
func TestPartitionedNeedsReadCommitted(t *testing.T) {
	t.Parallel()
	_, store, _ := partitionedStore(t, "pgx", sqlinbox.Monthly)
	_, ok, err := claim(context.Background(), store, &sql.TxOptions{Isolation: sql.LevelRepeatableRead}, "billing", "ev-1")
	require.ErrorContains(t, err, "needs READ COMMITTED")
	require.False(t, ok)
	require.True(t, claimOnce(t, store, "billing", "ev-1"))
}

// A store whose Partitioning does not match the table refuses to claim: the
// plain claim on a partitioned table would let cross-partition duplicates
// through.
func TestPartitioningMustMatchTheTable(t *testing.T) {
	t.Parallel()
	db, _, table := partitionedStore(t, "pgx", sqlinbox.Daily)
	plain, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table})
	require.NoError(t, err)
	_, _, err = claim(context.Background(), plain, nil, "billing", "ev-1")
	require.ErrorContains(t, err, "is partitioned but Config.Partitioning is none")
	// Purging it as a plain table could delete by ctid across partitions.
	_, _, err = plain.Maintenance().BeginPurge(context.Background())
	require.ErrorContains(t, err, "is partitioned but Config.Partitioning is none")

	plainTable := testdb.Table(t, db, "inbox_plain")
	plainStore, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: plainTable})
	require.NoError(t, err)
	require.NoError(t, plainStore.CreateSchema(context.Background()))
	wrong, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: plainTable, Partitioning: sqlinbox.Monthly})
	require.NoError(t, err)
	_, _, err = claim(context.Background(), wrong, nil, "billing", "ev-1")
	require.ErrorContains(t, err, "is not partitioned")

	_, err = sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: 7})
	require.ErrorContains(t, err, "Partitioning: unknown value 7")
}

// spellings returns two names of one table: as created, and qualified with
// the schema search_path resolves it to.
func spellings(t *testing.T, db *sql.DB, table string) (string, string) {
	t.Helper()
	var schema string
	require.NoError(t, db.QueryRow(`SELECT current_schema()`).Scan(&schema))
	return table, schema + "." + table
}

// Two instances configured with two spellings of one partitioned table
// ("inbox" and "public.inbox", as a rolling config change or another
// search_path gives) race copies of the same events: each event's handler
// runs once, with one effect and one inbox row. The event's lock must be
// the table's, not the spelling's, or neither instance waits for the other
// and the key, which includes processed_at, lets both rows in.
func TestPartitionedLockIgnoresTableSpelling(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, _, table := partitionedStore(t, driver, sqlinbox.Daily)
			effects := testdb.Table(t, db, "effects")
			_, err := db.Exec(`CREATE TABLE ` + effects + ` (event_id text NOT NULL)`)
			require.NoError(t, err)
			var (
				mu    sync.Mutex
				calls = map[string]int{}
				mws   []message.HandlerMiddleware
			)
			a, b := spellings(t, db, table)
			for _, name := range []string{a, b} {
				store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: name, Partitioning: sqlinbox.Daily})
				require.NoError(t, err)
				t.Cleanup(func() { _ = store.Close() })
				mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "billing"})
				require.NoError(t, err)
				mws = append(mws, mw)
			}
			handler := func(m *message.Message) ([]*message.Message, error) {
				id, _, _ := inbox.EventIDFromContext(m.Context())
				mu.Lock()
				calls[id]++
				mu.Unlock()
				tx, _ := inbox.TxFromContext(m.Context())
				if _, err := tx.ExecContext(m.Context(), `INSERT INTO `+effects+` VALUES ($1)`, id); err != nil {
					return nil, err
				}
				time.Sleep(30 * time.Millisecond) // the other copies arrive meanwhile
				return nil, nil
			}
			const events, copies = 4, 6
			testdb.RaceDeliveries(t, events, copies, func(c int, id string) error {
				_, err := mws[c%2](handler)(eventMsg(id))
				return err
			})
			for e := range events {
				id := fmt.Sprintf("ev-%d", e)
				require.Equal(t, 1, calls[id], "handler calls of %s", id)
				require.Equal(t, 1, countWhere(t, db, effects, id), "effects of %s", id)
				require.Equal(t, 1, countWhere(t, db, table, id), "inbox rows of %s", id)
			}
		})
	}
}

func eventMsg(id string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
	return m
}

func countWhere(t *testing.T, db *sql.DB, table, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table+` WHERE event_id = $1`, eventID).Scan(&n))
	return n
}
