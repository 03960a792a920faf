package vitess_test

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/bench"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The cost measurement's size; go test -run Cost -v -args -cost-rounds 15
// measures longer.
var (
	costRounds   = flag.Int("cost-rounds", 3, "rounds of TestCost, each running every target bare and with the inbox")
	costDuration = flag.Duration("cost-duration", time.Second, "how long TestCost runs each handler per round")
	costWorkers  = flag.Int("cost-workers", 8, "concurrent handlers of TestCost")
)

// costTarget is one way of reaching MariaDB, with its inbox and effect
// tables.
type costTarget struct {
	name    string
	db      *sql.DB
	store   *sqlinbox.Store
	effects string
}

// What the inbox costs through vtgate, beside the same handler on one
// MariaDB: the suite's MariaDB, and the MariaDB under Vitess reached
// directly (the same server, its settings and binary log, without vtgate
// and vttablet). Every target runs the bare handler (the effect's INSERT in
// a transaction of its own) and the inbox handler (the claim, with the
// customer as shard key through vtgate, then the same INSERT) in each
// round, in alternating order; it reports the median rate and its range
// over the rounds, and the median of each round's inbox/bare ratio.
func TestCost(t *testing.T) {
	db := open(t)
	through := costTarget{name: "vtgate (2 shards)", db: db, store: newStore(t, db, sqlinbox.Config{ShardKeyColumn: "shard_key"}, "shard_key", "hash"), effects: newEffects(t, db)}
	direct := directTarget(t, "MariaDB under Vitess, direct", testdb.Open(t, "mysql", vt.DirectDSN(vt.Shards()[0])))
	single := directTarget(t, "MariaDB of the suite", testdb.MySQL(t))
	targets := []costTarget{single, direct, through}

	type rates struct{ bare, inbox, ratio []float64 }
	results := make([]rates, len(targets))
	ctx := t.Context()
	for round := range *costRounds {
		for i, tg := range targets {
			runs := []struct {
				h    message.HandlerFunc
				into *[]float64
			}{{tg.bare(), &results[i].bare}, {tg.inbox(), &results[i].inbox}}
			if round%2 == 1 {
				runs[0], runs[1] = runs[1], runs[0]
			}
			var got [2]float64
			for j, run := range runs {
				r := bench.Run(ctx, run.h, *costWorkers, *costDuration, customerMessages)
				require.Zero(t, r.Errors, "%s: %v", tg.name, r.FirstErr)
				require.Positive(t, r.Msgs, tg.name)
				*run.into = append(*run.into, r.Rate())
				got[j] = r.Rate()
			}
			if round%2 == 1 {
				got[0], got[1] = got[1], got[0]
			}
			results[i].ratio = append(results[i].ratio, got[1]/got[0])
		}
	}
	var report strings.Builder
	fmt.Fprintf(&report, "%d rounds of %s per handler, %d workers; messages/s, median (min-max):\n", *costRounds, *costDuration, *costWorkers)
	for i, tg := range targets {
		r := results[i]
		fmt.Fprintf(&report, "  %-30s bare %s   inbox %s   inbox/bare %s\n", tg.name, spread(r.bare, "%.0f"), spread(r.inbox, "%.0f"), spread(r.ratio, "%.2f"))
	}
	vtBare, singleBare := median(results[2].bare), median(results[0].bare)
	vtInbox, singleInbox := median(results[2].inbox), median(results[0].inbox)
	fmt.Fprintf(&report, "  vtgate/single MariaDB: bare %.2f, inbox %.2f", vtBare/singleBare, vtInbox/singleInbox)
	t.Log(report.String())

	// Every inbox run claimed new events: one effect per claim.
	for _, tg := range targets {
		var claims, effects int
		require.NoError(t, tg.db.QueryRow("SELECT COUNT(*) FROM "+tg.store.Table()).Scan(&claims))
		require.NoError(t, tg.db.QueryRow("SELECT COUNT(*) FROM "+tg.effects+" WHERE copy = 1").Scan(&effects))
		require.Equal(t, claims, effects, tg.name)
	}
}

// directTarget makes the tables of a target without vtgate.
func directTarget(t *testing.T, name string, db *sql.DB) costTarget {
	t.Helper()
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, Table: testdb.Table(t, db, "inbox"), ShardKeyColumn: "shard_key"})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(t.Context()))
	effects := testdb.Name("effects")
	_, err = db.Exec("CREATE TABLE " + effects + " (customer_id BIGINT NOT NULL, event_id VARBINARY(255) NOT NULL, copy INT NOT NULL, PRIMARY KEY (customer_id, event_id, copy))")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + effects) })
	return costTarget{name: name, db: db, store: store, effects: effects}
}

// customerMessages makes messages with a new event id, of a customer out
// of 1,000.
func customerMessages(int) *message.Message {
	msg := message.NewMessage(uuid.Must(uuid.NewV7()).String(), nil)
	msg.Metadata.Set("customer_id", strconv.Itoa(1+rand.IntN(1000)))
	return msg
}

// bare writes the effect in a transaction of its own (copy 0).
func (tg costTarget) bare() message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, err := tg.db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		if err := tg.write(ctx, tx, msg, 0); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		return nil, tx.Commit()
	}
}

// inbox claims the message's event with its customer as shard key, then
// writes the effect in the claim's transaction (copy 1).
func (tg costTarget) inbox() message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		stx, _, err := tg.store.Claim(ctx, inboxdriver.Claim{Consumer: "bench", EventID: msg.UUID, ShardKey: msg.Metadata.Get("customer_id")})
		if err != nil || stx == nil {
			return nil, err
		}
		tx := stx.Handle().(*sql.Tx)
		if err := tg.write(ctx, tx, msg, 1); err != nil {
			_ = stx.Rollback(ctx)
			return nil, err
		}
		return nil, stx.Commit(ctx)
	}
}

func (tg costTarget) write(ctx context.Context, tx *sql.Tx, msg *message.Message, copyN int) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+tg.effects+" (customer_id, event_id, copy) VALUES (?, ?, ?)", msg.Metadata.Get("customer_id"), msg.UUID, copyN)
	return err
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread formats the median of xs and their range.
func spread(xs []float64, format string) string {
	return fmt.Sprintf(format+" ("+format+"-"+format+")", median(xs), slices.Min(xs), slices.Max(xs))
}
