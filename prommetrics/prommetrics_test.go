package prommetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/prommetrics"
	"github.com/watermill-inbox/inbox/purge"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

type fixture struct {
	reg     *prometheus.Registry
	metrics *prommetrics.Metrics
	store   *sqlinbox.Store
}

func setup(t *testing.T) fixture {
	t.Helper()
	db := testdb.Postgres(t, "pgx")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: testdb.Table(t, db, "inbox")})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	reg := prometheus.NewRegistry()
	m, err := prommetrics.New(reg, "")
	require.NoError(t, err)
	return fixture{reg: reg, metrics: m, store: store}
}

func event(id string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), nil)
	if id != "" {
		m.Metadata.Set("event_id", id)
	}
	return m
}

func ok(*message.Message) ([]*message.Message, error) { return nil, nil }

func TestMessagesByConsumerAndOutcome(t *testing.T) {
	t.Parallel()
	f := setup(t)
	billing, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "billing", Observer: f.metrics})
	require.NoError(t, err)
	analytics, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "analytics", Observer: f.metrics})
	require.NoError(t, err)

	for range 3 { // one processed, two duplicates
		_, err := billing(ok)(event("e1"))
		require.NoError(t, err)
	}
	_, err = analytics(ok)(event("e1"))
	require.NoError(t, err)
	_, err = billing(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("boom") })(event("e2"))
	require.Error(t, err)
	require.Panics(t, func() {
		_, _ = billing(func(*message.Message) ([]*message.Message, error) { panic("p") })(event("e3"))
	})
	_, err = billing(ok)(event("bad\x00id"))
	require.ErrorIs(t, err, inbox.ErrInvalidEventID)
	_, err = billing(ok)(message.NewMessage("", nil))
	require.ErrorIs(t, err, inbox.ErrMissingEventID)

	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP watermill_inbox_messages_total Messages that passed through the inbox middleware, by consumer and outcome (processed, duplicate, missing_id, invalid_id, in_flight, claim_failed, miswired, rolled_back, poisoned, commit_failed, id_reused, stale).
# TYPE watermill_inbox_messages_total counter
watermill_inbox_messages_total{consumer="analytics",outcome="processed"} 1
watermill_inbox_messages_total{consumer="billing",outcome="duplicate"} 2
watermill_inbox_messages_total{consumer="billing",outcome="invalid_id"} 1
watermill_inbox_messages_total{consumer="billing",outcome="missing_id"} 1
watermill_inbox_messages_total{consumer="billing",outcome="processed"} 1
watermill_inbox_messages_total{consumer="billing",outcome="rolled_back"} 2
`), "watermill_inbox_messages_total"))

	// Every message is timed; only those that reached the database have a
	// claim: 3 billing copies of e1, e2 and e3, and analytics' e1.
	families, err := f.reg.Gather()
	require.NoError(t, err)
	counts := map[string]uint64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				counts[mf.GetName()] += h.GetSampleCount()
				if mf.GetName() == "watermill_inbox_claim_duration_seconds" {
					require.Positive(t, h.GetSampleSum())
				}
			}
		}
	}
	require.Equal(t, map[string]uint64{
		"watermill_inbox_claim_duration_seconds":   6,
		"watermill_inbox_message_duration_seconds": 8,
	}, counts)
}

// A stale event processed under StaleProcess counts as processed, and only
// the stale counter shows that its duplicate may have gone unnoticed.
func TestStaleEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mw := func(policy inbox.StalePolicy) func(h message.HandlerFunc) message.HandlerFunc {
		mw, err := inbox.NewMiddleware(inbox.Config{
			Store: f.store, Consumer: "c", Observer: f.metrics,
			MaxEventAge: time.Hour, EventTime: inbox.EventTimeFromMetadata("event_time"), StaleEvents: policy,
		})
		require.NoError(t, err)
		return mw
	}
	aged := func(id string, age time.Duration) *message.Message {
		m := event(id)
		m.Metadata.Set("event_time", time.Now().Add(-age).Format(time.RFC3339Nano))
		return m
	}
	for _, m := range []*message.Message{aged("fresh", time.Minute), aged("old", 2*time.Hour), aged("old", 2*time.Hour)} {
		_, err := mw(inbox.StaleProcess)(ok)(m)
		require.NoError(t, err)
	}
	_, err := mw(inbox.StaleSkip)(ok)(aged("older", 3*time.Hour))
	require.NoError(t, err)

	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP watermill_inbox_stale_events_total Events older than inbox.Config.MaxEventAge, by consumer and outcome: the outcome is stale when the policy rejected or skipped them, and that of any message when it processed them (its duplicate may have gone unnoticed).
# TYPE watermill_inbox_stale_events_total counter
watermill_inbox_stale_events_total{consumer="c",outcome="duplicate"} 1
watermill_inbox_stale_events_total{consumer="c",outcome="processed"} 1
watermill_inbox_stale_events_total{consumer="c",outcome="stale"} 1
`), "watermill_inbox_stale_events_total"))
}

func TestClaimAndCommitFailures(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "c", Observer: f.metrics})
	require.NoError(t, err)

	// The handler kills its own transaction's connection and ignores the
	// error of that statement, so the COMMIT is what fails.
	_, err = mw(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := inbox.TxFromContext(msg.Context())
		_, _ = tx.ExecContext(msg.Context(), `SELECT pg_terminate_backend(pg_backend_pid())`)
		return nil, nil
	})(event("e1"))
	require.Error(t, err)
	require.NoError(t, f.store.DB().Close())
	_, err = mw(ok)(event("e2"))
	require.Error(t, err)

	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP watermill_inbox_messages_total Messages that passed through the inbox middleware, by consumer and outcome (processed, duplicate, missing_id, invalid_id, in_flight, claim_failed, miswired, rolled_back, poisoned, commit_failed, id_reused, stale).
# TYPE watermill_inbox_messages_total counter
watermill_inbox_messages_total{consumer="c",outcome="claim_failed"} 1
watermill_inbox_messages_total{consumer="c",outcome="commit_failed"} 1
`), "watermill_inbox_messages_total"))
}

// A message whose after-commit hook panics is processed, and counted as
// an after-commit failure.
func TestAfterCommitFailures(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "c", Observer: f.metrics})
	require.NoError(t, err)
	_, err = mw(func(msg *message.Message) ([]*message.Message, error) {
		return nil, inbox.AfterCommit(msg.Context(), func(context.Context) error { panic("hook exploded") })
	})(event("e1"))
	require.NoError(t, err)
	_, err = mw(ok)(event("e2"))
	require.NoError(t, err)

	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(`
# HELP watermill_inbox_after_commit_failures_total Processed messages whose inbox.AfterCommit hooks failed or panicked after the commit, by consumer: those hooks' effects are lost.
# TYPE watermill_inbox_after_commit_failures_total counter
watermill_inbox_after_commit_failures_total{consumer="c"} 1
# HELP watermill_inbox_messages_total Messages that passed through the inbox middleware, by consumer and outcome (processed, duplicate, missing_id, invalid_id, in_flight, claim_failed, miswired, rolled_back, poisoned, commit_failed, id_reused, stale).
# TYPE watermill_inbox_messages_total counter
watermill_inbox_messages_total{consumer="c",outcome="processed"} 2
`), "watermill_inbox_after_commit_failures_total", "watermill_inbox_messages_total"))
}

func TestPurgeRounds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: f.store, Consumer: "c"})
	require.NoError(t, err)
	for i := range 3 {
		_, err := mw(ok)(event(fmt.Sprint(i)))
		require.NoError(t, err)
	}
	p, err := purge.New(f.store, purge.Config{Retention: time.Nanosecond, AllowShortRetention: true, OnRound: f.metrics.PurgeRound(f.store.Table())})
	require.NoError(t, err)
	n, err := p.PurgeOnce(context.Background())
	require.NoError(t, err)
	f.metrics.ObservePurge(f.store.Table(), 0, 0, fmt.Errorf("round: %w", purge.ErrSkipped))

	table := f.store.Table()
	require.NoError(t, testutil.GatherAndCompare(f.reg, strings.NewReader(fmt.Sprintf(`
# HELP watermill_inbox_purge_rounds_total Purge rounds by inbox table and result (done, skipped, failed).
# TYPE watermill_inbox_purge_rounds_total counter
watermill_inbox_purge_rounds_total{result="done",table=%[1]q} 1
watermill_inbox_purge_rounds_total{result="skipped",table=%[1]q} 1
# HELP watermill_inbox_purge_rows_deleted_total Inbox rows removed by the purge (dropped partitions included), by table.
# TYPE watermill_inbox_purge_rows_deleted_total counter
watermill_inbox_purge_rows_deleted_total{table=%[1]q} %[2]d
`, table, n)), "watermill_inbox_purge_rounds_total", "watermill_inbox_purge_rows_deleted_total"))
	require.Equal(t, 1, testutil.CollectAndCount(f.reg, "watermill_inbox_purge_duration_seconds"))
}

func TestRegistersOnce(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	_, err := prommetrics.New(reg, "shop")
	require.NoError(t, err)
	_, err = prommetrics.New(reg, "shop")
	var already prometheus.AlreadyRegisteredError
	require.ErrorAs(t, err, &already)
	_, err = prommetrics.New(reg, "other")
	require.NoError(t, err, "another namespace is another set of metrics")
}

// A period blocked by an event dated ahead of the clock: the purge's rounds
// report its partition through the hook until its row is moved into it.
func TestPartitionsBlocked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Postgres(t, "pgx")
	table := testdb.Table(t, db, "inbox")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: table, Partitioning: sqlinbox.Daily, PartitionKey: sqlinbox.EventIDTime})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	partition, ahead := testdb.BlockLastTimePartition(t, db, table)
	tx, _, err := store.Claim(ctx, inboxdriver.Claim{Consumer: "billing", EventID: testdb.UUIDv7(ahead, "dated ahead")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	reg := prometheus.NewRegistry()
	metrics, err := prommetrics.New(reg, "")
	require.NoError(t, err)
	p, err := purge.New(store, purge.Config{Retention: 14 * 24 * time.Hour, OnPartitionsBlocked: metrics.PartitionsBlocked(table)})
	require.NoError(t, err)
	blocked := func(n int) string {
		return fmt.Sprintf(`
# HELP watermill_inbox_purge_partitions_blocked Partitions the last purge round of the table could not create, because the default partition holds rows of their period (events dated ahead of the clock, on a table partitioned by event time): claims of those periods land in the default partition.
# TYPE watermill_inbox_purge_partitions_blocked gauge
watermill_inbox_purge_partitions_blocked{table=%q} %d
`, table, n)
	}
	_, err = p.PurgeOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(blocked(1)), "watermill_inbox_purge_partitions_blocked"))

	sess, busy, err := store.Maintenance().BeginPurge(ctx)
	require.NoError(t, err)
	require.Nil(t, busy)
	parts, err := sess.CreatePartitions(ctx, purge.DefaultPartitionsAhead, time.Second)
	require.NoError(t, err)
	require.Len(t, parts.Blocked, 1)
	require.Equal(t, partition, parts.Blocked[0].Name)
	moved, err := sess.MoveBlocked(ctx, parts.Blocked[0], time.Second)
	require.NoError(t, err)
	require.EqualValues(t, 1, moved)
	require.NoError(t, sess.Close())

	_, err = p.PurgeOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(blocked(0)), "watermill_inbox_purge_partitions_blocked"))
}
