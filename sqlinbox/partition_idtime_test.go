package sqlinbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/oklog/ulid"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

const day = 24 * time.Hour

// idTimeStore is a store on a fresh table partitioned daily by the time
// inside event ids.
func idTimeStore(t *testing.T, driver string, mutate ...func(*sqlinbox.Config)) (*sql.DB, *sqlinbox.Store, string) {
	t.Helper()
	db := testdb.Postgres(t, driver)
	table := testdb.Table(t, db, "inbox_idtime")
	c := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime}
	for _, m := range mutate {
		m(&c)
	}
	store, err := sqlinbox.New(db, c)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	t.Cleanup(func() { _ = store.Close() })
	return db, store, table
}

// dbNow is the database clock, which names the partitions CreateSchema
// makes.
func dbNow(t *testing.T, db *sql.DB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.QueryRow(`SELECT now()`).Scan(&now))
	return now.UTC()
}

func dayPartition(table string, at time.Time) string {
	return table + "_p" + at.UTC().Format("20060102")
}

// Every copy of an event carries the same id, hence the same time: it goes
// to the same partition, where the key sees the duplicate. CreateSchema
// made today's partition and the next three, so nothing goes to the
// default partition in normal operation, producer clocks a day off
// included.
func TestEventIDTimeClaims(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			db, store, table := idTimeStore(t, driver)
			now := dbNow(t, db)
			ahead := now.Add(day) // a producer whose clock is a day ahead
			for _, tc := range []struct {
				id        string
				partition string
			}{
				{testdb.UUIDv7(now, "a"), dayPartition(table, now)},
				{ulid.MustNew(ulid.Timestamp(now), rand.Reader).String(), dayPartition(table, now)}, // a ULID, as watermill.NewULID makes
				{testdb.UUIDv7(ahead, "skewed"), dayPartition(table, ahead)},
			} {
				require.True(t, claimOnce(t, store, "billing", tc.id), tc.id)
				require.False(t, claimOnce(t, store, "billing", tc.id), "a copy of %s", tc.id)
				require.True(t, claimOnce(t, store, "mailer", tc.id), "another consumer")
				require.Equal(t, tc.partition, partitionOf(t, db, table, "billing", tc.id))
			}
			ids := map[string]string{}
			for i := range 10 {
				ids[fmt.Sprintf("ev-%d", i)] = testdb.UUIDv7(now, fmt.Sprintf("race-%d", i))
			}
			testdb.RaceClaims(t, 10, 4, func(label string) (func() error, bool, error) {
				tx, ok, err := claim(context.Background(), store, nil, "race", ids[label])
				if !ok {
					return nil, false, err
				}
				return tx.Commit, true, err
			})
			check, err := store.Maintenance().Check(context.Background(), sqlinbox.SchemaPartitionsAhead)
			require.NoError(t, err)
			require.True(t, check.OK(), "%+v", check.Findings)
		})
	}
}

// Ids that carry no time are refused before any SQL, by the store and by
// the middleware, which runs no handler and acks nothing.
func TestEventIDTimeRefusesIDsWithoutTime(t *testing.T) {
	t.Parallel()
	db, store, table := idTimeStore(t, "pgx")
	for _, id := range []string{watermill.NewUUID(), "order-42"} {
		_, err := store.CheckEventID(id)
		require.ErrorIs(t, err, inbox.ErrInvalidEventID)
		require.ErrorContains(t, err, "carries no time (a UUIDv7 or a ULID does)")
		_, _, err = store.Claim(context.Background(), inboxdriver.Claim{Consumer: "billing", EventID: id})
		require.ErrorIs(t, err, inbox.ErrInvalidEventID)
	}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "billing"})
	require.NoError(t, err)
	calls := 0
	_, err = mw(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })(message.NewMessage(watermill.NewUUID(), nil))
	require.ErrorIs(t, err, inbox.ErrInvalidEventID)
	require.Zero(t, calls)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&rows))
	require.Zero(t, rows)
}

// A ULID with a letter outside Crockford's alphabet (I, L, O, U), or
// beyond the 48-bit time, is refused as an invalid ULID naming what is
// wrong, not as an id that carries no time.
func TestEventIDTimeInvalidULID(t *testing.T) {
	t.Parallel()
	_, store, _ := idTimeStore(t, "pgx")
	for id, want := range map[string]string{
		"01FWHE4YDG000000000000000U": `"01FWHE4YDG000000000000000U" is not a valid ULID: 'U' at position 26 is not in its alphabet (Crockford's base32 has no I, L, O or U)`,
		"01fwhe4ydgL000000000000000": `"01fwhe4ydgL000000000000000" is not a valid ULID: 'L' at position 11 is not in its alphabet`,
		"81FWHE4YDG0000000000000000": `"81FWHE4YDG0000000000000000" is not a valid ULID: its first character, 8, is above 7: the time would not fit in 48 bits`,
	} {
		_, err := store.CheckEventID(id)
		require.ErrorIs(t, err, inbox.ErrInvalidEventID)
		require.ErrorContains(t, err, want)
		require.NotContains(t, err.Error(), "carries no time")
	}
}

// An event whose time no partition covers, long past or far ahead, lands
// in the default partition and is deduplicated there. The purge drops
// expired partitions whole and deletes expired rows of the default
// partition by their event time. Once an event's partition is gone, a
// copy of it is new again: what MaxEventAge is for.
func TestEventIDTimeOutsideThePartitions(t *testing.T) {
	t.Parallel()
	db, store, table := idTimeStore(t, "pgx")
	now := dbNow(t, db)
	old := createPartition(t, db, table, 10*day)
	ids := map[string]string{
		"old":    testdb.UUIDv7(now.Add(-10*day), "old"),
		"past":   testdb.UUIDv7(now.Add(-40*day), "past"),
		"future": testdb.UUIDv7(now.Add(700*day), "future"),
		"recent": testdb.UUIDv7(now.Add(-2*day), "recent"),
		"now":    testdb.UUIDv7(now, "now"),
	}
	for _, label := range []string{"old", "past", "future", "recent", "now"} {
		require.True(t, claimOnce(t, store, "billing", ids[label]), label)
		require.False(t, claimOnce(t, store, "billing", ids[label]), label)
	}
	def := table + "_default"
	require.Equal(t, old, partitionOf(t, db, table, "billing", ids["old"]))
	for _, label := range []string{"past", "future", "recent"} {
		require.Equal(t, def, partitionOf(t, db, table, "billing", ids[label]), label)
	}
	oldest, ok, err := store.OldestClaim(context.Background())
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, now.Add(-40*day).Truncate(time.Millisecond), oldest)

	p, err := purge.New(store, purge.Config{Retention: 3 * day})
	require.NoError(t, err)
	deleted, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, deleted, "the old partition's row and the past one")
	for label, want := range map[string]bool{"old": false, "past": false, "future": true, "recent": true, "now": true} {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table+` WHERE event_id = $1`, ids[label]).Scan(&n))
		require.Equal(t, want, n == 1, label)
	}
	require.NotContains(t, testdb.TimePartitions(t, db, table), old)
	// A copy of the old event after its partition was dropped: new again.
	require.True(t, claimOnce(t, store, "billing", ids["old"]))
	require.Equal(t, def, partitionOf(t, db, table, "billing", ids["old"]))
}

// A table partitioned by one time and claimed as if by the other is
// refused at the first claim, before a duplicate could slip through.
func TestPartitionKeyMustMatchTheTable(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	for _, made := range []sqlinbox.PartitionKey{sqlinbox.ProcessedAt, sqlinbox.EventIDTime} {
		table := testdb.Table(t, db, "inbox_key")
		c := sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: sqlinbox.Daily, PartitionKey: made}
		store, err := sqlinbox.New(db, c)
		require.NoError(t, err)
		require.NoError(t, store.CreateSchema(context.Background()))
		c.PartitionKey = 1 - made
		other, err := sqlinbox.New(db, c)
		require.NoError(t, err)
		_, _, err = other.Claim(context.Background(), inboxdriver.Claim{Consumer: "billing", EventID: testdb.UUIDv7(testdb.Now(), "x")})
		require.ErrorContains(t, err, fmt.Sprintf("is partitioned by RANGE (%s) but Config.PartitionKey is %s", made, 1-made))
		check, err := other.Maintenance().Check(context.Background(), 0)
		require.NoError(t, err)
		require.False(t, check.OK())
	}
}

func TestPartitionKeyConfig(t *testing.T) {
	t.Parallel()
	db := testdb.Postgres(t, "pgx")
	for _, tc := range []struct {
		c    sqlinbox.Config
		want string
	}{
		{sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, PartitionKey: sqlinbox.EventIDTime}, "PartitionKey: event_time needs Partitioning Daily or Monthly"},
		{sqlinbox.Config{Dialect: sqlinbox.MySQL, Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime}, "only available on PostgreSQL"},
		{sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Partitioning: sqlinbox.Daily, PartitionKey: 7}, "PartitionKey: unknown value 7"},
	} {
		_, err := sqlinbox.New(db, tc.c)
		require.ErrorContains(t, err, tc.want)
	}
}

// Fingerprints, a claim timeout and Forget work on the time-keyed table as
// on a plain one: the time rides along as the key's middle column.
func TestEventIDTimeFingerprintTimeoutForget(t *testing.T) {
	t.Parallel()
	_, store, _ := idTimeStore(t, "pgx", func(c *sqlinbox.Config) {
		c.Fingerprints, c.ClaimTimeout, c.UUIDEventIDs = true, 100*time.Millisecond, true
	})
	ctx := context.Background()
	id := testdb.UUIDv7(testdb.Now(), "fp")
	tx, stored, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id, Fingerprint: []byte("v1")})
	require.NoError(t, err)
	require.Nil(t, stored)
	// A copy while the first is in flight waits ClaimTimeout, then gives up.
	_, _, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id, Fingerprint: []byte("v1")})
	require.ErrorIs(t, err, inbox.ErrInFlight)
	require.NoError(t, tx.Commit(ctx))
	tx, stored, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id, Fingerprint: []byte("v2")})
	require.NoError(t, err)
	require.Nil(t, tx)
	require.Equal(t, []byte("v1"), stored)

	removed, err := store.Maintenance().Forget(ctx, "billing", []string{id})
	require.NoError(t, err)
	require.Len(t, removed, 1)
	tx, _, err = store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: id})
	require.NoError(t, err)
	require.NotNil(t, tx, "forgotten, so new again")
	require.NoError(t, tx.Rollback(ctx))
	_, err = store.Maintenance().Forget(ctx, "billing", []string{"not-a-timed-id"})
	require.True(t, errors.Is(err, inbox.ErrInvalidEventID), "%v", err)
}

// CreateSchema makes the current period's partition and the next three,
// daily and monthly, and runs again unchanged; SchemaSQL carries the same
// block, for migration tools.
func TestCreateSchemaMakesPartitions(t *testing.T) {
	t.Parallel()
	for _, key := range []sqlinbox.PartitionKey{sqlinbox.ProcessedAt, sqlinbox.EventIDTime} {
		for _, mode := range []sqlinbox.Partitioning{sqlinbox.Daily, sqlinbox.Monthly} {
			t.Run(fmt.Sprintf("%s/%s", key, mode), func(t *testing.T) {
				t.Parallel()
				db := testdb.Postgres(t, "pgx")
				table := testdb.Table(t, db, "inbox_schema")
				store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: mode, PartitionKey: key})
				require.NoError(t, err)
				require.Contains(t, store.SchemaSQL(), "DO $$")
				require.NoError(t, store.CreateSchema(context.Background()))
				require.NoError(t, store.CreateSchema(context.Background()))
				now := dbNow(t, db)
				var want []string
				for i := range sqlinbox.SchemaPartitionsAhead + 1 {
					if mode == sqlinbox.Daily {
						want = append(want, dayPartition(table, now.AddDate(0, 0, i)))
					} else {
						want = append(want, table+"_p"+time.Date(now.Year(), now.Month()+time.Month(i), 1, 0, 0, 0, 0, time.UTC).Format("200601"))
					}
				}
				require.Equal(t, want, testdb.TimePartitions(t, db, table))
				check, err := store.Maintenance().Check(context.Background(), sqlinbox.SchemaPartitionsAhead)
				require.NoError(t, err)
				require.True(t, check.OK(), "%+v", check.Findings)
			})
		}
	}
}

// The stale-event policy, reading the time from the id itself, turns away
// a copy older than the retention before any SQL, where its partition may
// be gone and the copy would pass as new.
func TestEventIDTimeStaleCopies(t *testing.T) {
	t.Parallel()
	db, store, table := idTimeStore(t, "pgx")
	mw, err := inbox.NewMiddleware(inbox.Config{
		Store: store, Consumer: "billing",
		MaxEventAge: 2 * day, EventTime: inbox.EventTimeFromEventID(inbox.DefaultEventID), StaleEvents: inbox.StaleReject,
	})
	require.NoError(t, err)
	calls := 0
	h := mw(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
	now := dbNow(t, db)
	_, err = h(message.NewMessage(testdb.UUIDv7(now.Add(-3*day), "old"), nil))
	require.ErrorIs(t, err, inbox.ErrStaleEvent)
	_, err = h(message.NewMessage(testdb.UUIDv7(now, "new"), nil))
	require.NoError(t, err)
	require.Equal(t, 1, calls)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table).Scan(&rows))
	require.Equal(t, 1, rows)
}

// Forget and the claims listing look each claim up with the time its id
// carries, as the claim does, so PostgreSQL reads the id's partition only,
// not every partition of the table: a lookup in one partition of many,
// with no wait for the partitions it does not read. Their plans (EXPLAIN
// ANALYZE) scan the partitions of the ids asked for, and no other.
func TestEventIDTimeLookupsReadOnlyTheIDsPartitions(t *testing.T) {
	t.Parallel()
	db, store, table := idTimeStore(t, "pgx")
	ctx := context.Background()
	now := dbNow(t, db)
	for _, ago := range []time.Duration{2 * day, 3 * day, 4 * day} {
		createPartition(t, db, table, ago)
	}
	old, recent := testdb.UUIDv7(now.Add(-3*day), "old"), testdb.UUIDv7(now, "recent")
	for i := range 20 {
		for _, at := range []time.Time{now.Add(-2 * day), now.Add(-3 * day), now.Add(-4 * day), now, now.Add(day)} {
			require.True(t, claimOnce(t, store, "billing", testdb.UUIDv7(at, fmt.Sprint("filler-", i))))
		}
	}
	require.True(t, claimOnce(t, store, "billing", old))
	require.True(t, claimOnce(t, store, "billing", recent))
	_, err := db.Exec("ANALYZE " + table)
	require.NoError(t, err)

	for _, tc := range []struct {
		ids  []string
		want []string
	}{
		{[]string{old}, []string{partitionOf(t, db, table, "billing", old)}},
		{[]string{old, recent}, []string{partitionOf(t, db, table, "billing", old), partitionOf(t, db, table, "billing", recent)}},
	} {
		plan, err := sqlinbox.ExplainClaims(ctx, store, "billing", tc.ids)
		require.NoError(t, err)
		require.ElementsMatch(t, tc.want, scanned(t, plan), "the claims listing of %d ids", len(tc.ids))
		plan, err = sqlinbox.ExplainForget(ctx, store, "billing", tc.ids)
		require.NoError(t, err)
		require.ElementsMatch(t, tc.want, scanned(t, plan), "Forget's delete of %d ids", len(tc.ids))
	}

	claims, err := store.Maintenance().Claims(ctx, maintenance.ClaimFilter{Consumer: "billing", EventIDs: []string{old, recent, testdb.UUIDv7(now, "never claimed")}})
	require.NoError(t, err)
	require.Len(t, claims, 2)
	removed, err := store.Maintenance().Forget(ctx, "billing", []string{recent, old})
	require.NoError(t, err)
	require.Len(t, removed, 2)
	require.True(t, claimOnce(t, store, "billing", old), "forgotten, so new again")
}

// scanned returns the relations an EXPLAIN (ANALYZE, FORMAT JSON) plan
// read: those of its scans that ran at least once.
func scanned(t *testing.T, plan string) []string {
	t.Helper()
	type node struct {
		NodeType string  `json:"Node Type"`
		Relation string  `json:"Relation Name"`
		Loops    float64 `json:"Actual Loops"`
		Plans    []node  `json:"Plans"`
	}
	var root []struct {
		Plan node `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal([]byte(plan), &root), plan)
	var out []string
	var walk func(n node)
	walk = func(n node) {
		if strings.Contains(n.NodeType, "Scan") && n.Relation != "" && n.Loops > 0 && !slices.Contains(out, n.Relation) {
			out = append(out, n.Relation)
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(root[0].Plan)
	return out
}

// BenchmarkEventIDTimeLookups measures the claims listing and Forget on a
// table partitioned daily by event time, INBOX_BENCH_ROWS rows (600,000 by
// default) over 30 days: of one id, and of 500 ids spread over the days.
//
//	go test -run '^$' -bench BenchmarkEventIDTimeLookups -benchtime 20x -count 5 ./sqlinbox/
func BenchmarkEventIDTimeLookups(b *testing.B) {
	rows := 600_000
	if s := os.Getenv("INBOX_BENCH_ROWS"); s != "" {
		var err error
		rows, err = strconv.Atoi(s)
		require.NoError(b, err)
	}
	ctx := context.Background()
	db := testdb.Postgres(b, "pgx")
	table := testdb.Table(b, db, "inbox_idtime_bench")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime})
	require.NoError(b, err)
	require.NoError(b, store.CreateSchema(ctx))
	for ago := 1; ago < 30; ago++ {
		createPartition(b, db, table, time.Duration(ago)*day)
	}
	// UUIDv7 ids, each with the time it carries, spread over the 30 UTC
	// days up to today.
	_, err = db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, event_id, event_time)
SELECT 'billing', substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || substr(r, 1, 3) || '-8' || substr(r, 4, 3) || '-' || substr(r, 7, 12), t
FROM (SELECT t, lpad(to_hex((extract(epoch FROM t) * 1000)::bigint), 12, '0') AS h, replace(gen_random_uuid()::text, '-', '') AS r
	FROM (SELECT timestamptz 'epoch' + ((extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'UTC')) * 1000)::bigint
		- (g %% 30) * 86400000 + (g * 7919) %% 86400000) * interval '1 millisecond' AS t
		FROM generate_series(1::bigint, $1) AS g) AS s) AS v`, table), rows)
	require.NoError(b, err)
	_, err = db.ExecContext(ctx, "ANALYZE "+table)
	require.NoError(b, err)
	pick := func(n int) (ids []string, times []time.Time) {
		r, err := db.QueryContext(ctx, fmt.Sprintf(`SELECT event_id, event_time FROM %s TABLESAMPLE SYSTEM (10) ORDER BY random() LIMIT $1`, table), n)
		require.NoError(b, err)
		defer r.Close()
		for r.Next() {
			var id string
			var at time.Time
			require.NoError(b, r.Scan(&id, &at))
			ids, times = append(ids, id), append(times, at)
		}
		require.NoError(b, r.Err())
		return ids, times
	}
	for _, n := range []int{1, 500} {
		ids, times := pick(n)
		b.Run(fmt.Sprintf("Claims/%d", n), func(b *testing.B) {
			for b.Loop() {
				claims, err := store.Maintenance().Claims(ctx, maintenance.ClaimFilter{Consumer: "billing", EventIDs: ids})
				require.NoError(b, err)
				require.Len(b, claims, n)
			}
		})
		b.Run(fmt.Sprintf("Forget/%d", n), func(b *testing.B) {
			for b.Loop() {
				removed, err := store.Maintenance().Forget(ctx, "billing", ids)
				require.NoError(b, err)
				require.Len(b, removed, n)
				b.StopTimer()
				_, err = db.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (consumer, event_id, event_time) SELECT 'billing', unnest($1::text[]), unnest($2::timestamptz[])`, table), ids, times)
				require.NoError(b, err)
				b.StartTimer()
			}
		})
	}
}
