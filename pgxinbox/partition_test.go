package pgxinbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// claimTx claims (consumer, eventID) as the middleware does and returns
// the claim's transaction, nil for a duplicate. It ends through the
// store's, which gives the claim's place in the pool back.
func (f *fixture) claimTx(ctx context.Context, opts *sql.TxOptions, consumer, eventID string) (pgx.Tx, bool, error) {
	tx, _, err := f.store.Claim(ctx, inboxdriver.Claim{TxOptions: opts, Consumer: consumer, EventID: eventID})
	if tx == nil {
		return nil, false, err
	}
	return heldTx{Tx: tx.Handle().(pgx.Tx), claim: tx}, true, err
}

// heldTx is a claim's pgx.Tx that commits and rolls back through the
// store's transaction.
type heldTx struct {
	pgx.Tx
	claim inboxdriver.Tx
}

func (t heldTx) Commit(ctx context.Context) error   { return t.claim.Commit(ctx) }
func (t heldTx) Rollback(ctx context.Context) error { return t.claim.Rollback(ctx) }

func (f *fixture) claim(t *testing.T, consumer, eventID string) bool {
	t.Helper()
	tx, ok, err := f.claimTx(context.Background(), nil, consumer, eventID)
	require.NoError(t, err)
	if ok {
		require.NoError(t, tx.Commit(context.Background()))
	}
	return ok
}

// partitionOf returns the partition holding (consumer, eventID).
func (f *fixture) partitionOf(t *testing.T, consumer, eventID string) string {
	t.Helper()
	var name string
	require.NoError(t, f.store.Pool().QueryRow(context.Background(),
		`SELECT tableoid::regclass::text FROM `+f.store.Table()+` WHERE consumer = $1 AND event_id = $2`, consumer, eventID).Scan(&name))
	return name
}

// now is the database clock, which names the partitions.
func (f *fixture) now(t *testing.T) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, f.store.Pool().QueryRow(context.Background(), `SELECT now()`).Scan(&now))
	return now.UTC()
}

func (f *fixture) exec(t *testing.T, query string) {
	t.Helper()
	_, err := f.store.Pool().Exec(context.Background(), query)
	require.NoError(t, err)
}

// The pipelined claim finds a duplicate whose original sits in another
// partition, which the partitioned table's key cannot see: claim an event,
// move its row across the partition boundary (as time passing would),
// deliver it again.
func TestPartitionedDuplicateAcrossPartitions(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{Partitioning: sqlinbox.Daily})
	table := f.store.Table()
	now := f.now(t)
	today := table + "_p" + now.Format("20060102") // made by CreateSchema
	from := time.Date(now.Year(), now.Month(), now.Day()-5, 0, 0, 0, 0, time.UTC)
	old := table + "_p" + from.Format("20060102")
	f.exec(t, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s+00') TO ('%s+00')`,
		old, table, from.Format(time.DateTime), from.AddDate(0, 0, 1).Format(time.DateTime)))

	require.True(t, f.claim(t, "billing", "ev-1"))
	require.Equal(t, today, f.partitionOf(t, "billing", "ev-1"))
	require.False(t, f.claim(t, "billing", "ev-1"), "same partition")

	f.exec(t, `UPDATE `+table+` SET processed_at = processed_at - interval '5 days' WHERE event_id = 'ev-1'`)
	require.Equal(t, old, f.partitionOf(t, "billing", "ev-1"))
	require.False(t, f.claim(t, "billing", "ev-1"), "a duplicate whose original is in another partition must be detected")
	require.True(t, f.claim(t, "other-consumer", "ev-1"))

	f.exec(t, `INSERT INTO `+table+` (consumer, event_id, processed_at) VALUES ('billing', 'ev-2', now() - interval '40 days')`)
	require.Equal(t, table+"_default", f.partitionOf(t, "billing", "ev-2"))
	require.False(t, f.claim(t, "billing", "ev-2"))

	require.Equal(t, 2, f.claims(t, "ev-1"))
	f.noOpenTransactions(t)
}

// Racing pipelined claims of one event on a partitioned table: one winner,
// although the lock and the claim reach the server in one batch and the key
// cannot arbitrate (every claim's processed_at differs).
func TestPartitionedRacingClaimsOneWinner(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{Partitioning: sqlinbox.Daily})
	const events, racers = 5, 12
	testdb.RaceClaims(t, events, racers, func(id string) (func() error, bool, error) {
		ctx := context.Background()
		tx, ok, err := f.claimTx(ctx, nil, "billing", id)
		if !ok {
			return nil, false, err
		}
		return func() error { return tx.Commit(ctx) }, true, nil
	})
	for e := range events {
		id := fmt.Sprintf("ev-%d", e)
		require.Equal(t, 1, f.claims(t, id), id)
	}
	f.noOpenTransactions(t)
}

// As on database/sql, partitioned claims refuse REPEATABLE READ and
// SERIALIZABLE: the snapshot would predate the wait for the event's lock.
// The refused claim leaves no row and no open transaction.
func TestPartitionedNeedsReadCommitted(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{Partitioning: sqlinbox.Monthly})
	for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		tx, ok, err := f.claimTx(context.Background(), &sql.TxOptions{Isolation: iso}, "billing", "ev-1")
		if ok {
			_ = tx.Rollback(context.Background())
		}
		require.ErrorContains(t, err, "needs READ COMMITTED", iso)
		require.False(t, ok)
	}
	require.Zero(t, f.claims(t, "ev-1"))
	f.noOpenTransactions(t)
	tx, ok, err := f.claimTx(context.Background(), &sql.TxOptions{Isolation: sql.LevelReadCommitted}, "billing", "ev-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.Commit(context.Background()))
	require.Equal(t, 1, f.claims(t, "ev-1"))
}

// Copies of the same events race through native pgx stores configured with
// two spellings of one partitioned table ("inbox", "public.inbox") and a
// database/sql store beside them: the pipelined lock is the table's, shared
// with database/sql's, so each event's handler runs once, with one effect
// and one inbox row.
func TestPartitionedLockIgnoresTableSpelling(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{Partitioning: sqlinbox.Daily})
	ctx := context.Background()
	table := f.store.Table()
	var schema string
	require.NoError(t, f.store.Pool().QueryRow(ctx, `SELECT current_schema()`).Scan(&schema))
	effects := testdb.Name("effects")
	f.exec(t, `CREATE TABLE `+effects+` (event_id text NOT NULL)`)
	t.Cleanup(func() { _, _ = f.store.Pool().Exec(context.Background(), "DROP TABLE IF EXISTS "+effects) })

	var (
		mu    sync.Mutex
		calls = map[string]int{}
	)
	effect := func(ctx context.Context, exec func(ctx context.Context, sql string, args ...any) error) error {
		id, _, _ := inbox.EventIDFromContext(ctx)
		mu.Lock()
		calls[id]++
		mu.Unlock()
		if err := exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, id); err != nil {
			return err
		}
		time.Sleep(30 * time.Millisecond) // the other copies arrive meanwhile
		return nil
	}
	native := func(m *message.Message) ([]*message.Message, error) {
		tx, _ := pgxinbox.TxFromContext(m.Context())
		return nil, effect(m.Context(), func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		})
	}
	std := func(m *message.Message) ([]*message.Message, error) {
		tx, _ := inbox.TxFromContext(m.Context())
		return nil, effect(m.Context(), func(ctx context.Context, sql string, args ...any) error {
			_, err := tx.ExecContext(ctx, sql, args...)
			return err
		})
	}
	qualified := newStore(t, sqlinbox.Config{Table: schema + "." + table, Partitioning: sqlinbox.Daily})
	qualifiedMW, err := inbox.NewMiddleware(inbox.Config{Store: qualified, Consumer: "c"})
	require.NoError(t, err)
	stdStore, err := sqlinbox.New(testdb.Postgres(t, "pgx"), sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: schema + "." + table, Partitioning: sqlinbox.Daily})
	require.NoError(t, err)
	stdMW, err := inbox.NewMiddleware(inbox.Config{Store: stdStore, Consumer: "c"})
	require.NoError(t, err)
	handlers := []message.HandlerFunc{f.mw(native), qualifiedMW(native), stdMW(std)}

	const events, copies = 4, 6
	testdb.RaceDeliveries(t, events, copies, func(c int, id string) error {
		_, err := handlers[c%len(handlers)](msg(id))
		return err
	})
	for e := range events {
		id := fmt.Sprintf("ev-%d", e)
		require.Equal(t, 1, calls[id], "handler calls of %s", id)
		require.Equal(t, 1, f.claims(t, id), "inbox rows of %s", id)
		var n int
		require.NoError(t, f.store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+effects+` WHERE event_id = $1`, id).Scan(&n))
		require.Equal(t, 1, n, "effects of %s", id)
	}
	f.noOpenTransactions(t)
}

// On a table partitioned by the time inside event ids, the pipelined claim
// is the plain table's: BEGIN and the INSERT in one batch, no lock, every
// copy of an event in the same partition, where the key sees it.
func TestEventIDTimeClaims(t *testing.T) {
	t.Parallel()
	f := setup(t, sqlinbox.Config{Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime, UUIDEventIDs: true, Fingerprints: true})
	require.Empty(t, f.store.Maintenance().ClaimSQL().Before, "no lock before the claim")
	table, now := f.store.Table(), f.now(t)
	id, old := testdb.UUIDv7(now, "a"), testdb.UUIDv7(now.Add(-40*24*time.Hour), "old")
	for _, id := range []string{id, old} {
		require.True(t, f.claim(t, "billing", id))
		require.False(t, f.claim(t, "billing", id))
		require.True(t, f.claim(t, "mailer", id))
	}
	require.Equal(t, table+"_p"+now.Format("20060102"), f.partitionOf(t, "billing", id))
	require.Equal(t, table+"_default", f.partitionOf(t, "billing", old))

	ctx := context.Background()
	tx, _, err := f.store.Claim(ctx, inboxdriver.Claim{Consumer: "fp", EventID: id, Fingerprint: []byte("v1")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	tx, stored, err := f.store.Claim(ctx, inboxdriver.Claim{Consumer: "fp", EventID: id, Fingerprint: []byte("v2")})
	require.NoError(t, err)
	require.Nil(t, tx)
	require.Equal(t, []byte("v1"), stored)

	_, _, err = f.store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: "0b4cdd4c-4bd9-4c4b-9b8c-0b3ff8fd0c1e"}) // a UUIDv4
	require.ErrorIs(t, err, inbox.ErrInvalidEventID)

	ids := map[string]string{}
	for i := range 10 {
		ids[fmt.Sprintf("ev-%d", i)] = testdb.UUIDv7(now, fmt.Sprintf("race-%d", i))
	}
	testdb.RaceClaims(t, 10, 4, func(label string) (func() error, bool, error) {
		tx, ok, err := f.claimTx(ctx, nil, "race", ids[label])
		if !ok {
			return nil, false, err
		}
		return func() error { return tx.Commit(ctx) }, true, err
	})
	f.noOpenTransactions(t)
}
