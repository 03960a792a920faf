package jobqueue_test

import (
	"context"
	stdsql "database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
)

// rounds is how many times each store's test kills its three processes; the
// test command runs one round, a longer run raises it:
// go test ./jobqueue/ -run TestInvoiceEmailsSurviveKills -args -rounds 5
var rounds = flag.Int("rounds", 1, "rounds of three kills per store, each with ordersPerRound new orders")

const (
	ordersPerRound = 30
	waitFor        = 60 * time.Second

	// Where a child process dies, with SIGKILL.
	killAfterCommit = "after-commit" // the consumer, right after an inbox commit: invoice and job committed, no ack
	killBeforeSend  = "before-send"  // a worker that took a job, before it connects to the SMTP server
	killAfterAccept = "after-accept" // a worker whose email the SMTP server accepted, before River records the job complete
)

// spec is what a child process runs: one process of the service, killed at
// the At-th event of its kind.
type spec struct {
	Names   names
	Process string
	Kill    string
	At      int64
}

// Every order is delivered at least twice (published twice, and again after
// each kill of a consumer), every email job is worked by processes that die
// before and after their send, and still: one invoice and one job per
// order, every email accepted at least once, and each duplicate email a copy
// accepted from a killed process before its job completed, which the job's
// rescue by River sent again.
func TestInvoiceEmailsSurviveKills(t *testing.T) {
	t.Parallel()
	t.Run("pgx", func(t *testing.T) { invoiceEmailsSurviveKills(t, pgxBackend) })
	t.Run("database-sql", func(t *testing.T) { invoiceEmailsSurviveKills(t, sqlBackend) })
}

func invoiceEmailsSurviveKills[TTx any](t *testing.T, open func(testing.TB, names) backend[TTx]) {
	var s spec
	if killtest.Child(&s) {
		runChild(t, s, open)
		return
	}
	t.Parallel()
	f := setup(t, open)

	type target struct{ process, eventID string }
	var afterCommit, beforeSend, afterAccept []target
	killed := map[string]bool{}
	for r := 1; r <= *rounds; r++ {
		f.publishOrders(t, ordersPerRound)
		for _, k := range []struct {
			mode    string
			at      int64
			targets *[]target
		}{
			{killAfterCommit, 5, &afterCommit},
			{killBeforeSend, 2, &beforeSend},
			{killAfterAccept, 2, &afterAccept},
		} {
			process := fmt.Sprintf("round%d-%s", r, k.mode)
			*k.targets = append(*k.targets, target{process, f.kill(t, process, k.mode, k.at)})
			killed[process] = true
		}
	}

	// The last process rescues what the kills left running, once River sees
	// it stuck, and finishes everything.
	f.waitRescuable(t)
	last := &process[TTx]{name: "last", n: f.n, b: f.b}
	stop := last.start(t, true)
	f.waitDone(t)
	stop()

	// One invoice and one job per order.
	require.Equal(t, ones(f.events), effects.CountByID(t, f.db, `SELECT event_id, count(*) FROM `+f.n.Invoices+` GROUP BY event_id`), "invoices per order")
	require.Equal(t, ones(f.events), effects.CountByID(t, f.db, `SELECT args->>'event_id', count(*) FROM `+f.n.River+`.river_job GROUP BY 1`), "email jobs per order")
	rescues := effects.CountByID(t, f.db, `SELECT args->>'event_id', coalesce((metadata->>'river:rescue_count')::int, 0) FROM `+f.n.River+`.river_job`)

	// Every email at least once; every duplicate explained.
	mail := f.mail.received()
	accepted, duplicates, byCause := 0, 0, map[string]int{}
	for _, id := range f.events {
		senders := mail[messageID(id)]
		require.NotEmpty(t, senders, "the email for %s was never accepted", id)
		accepted += len(senders)
		dup := len(senders) - 1
		duplicates += dup
		for _, s := range senders[:dup] {
			require.True(t, killed[s], "%s: a copy accepted from %s, which was not killed", id, s)
			byCause[s]++
		}
		require.GreaterOrEqual(t, rescues[id], dup, "%s: %d duplicate emails, but River rescued its job %d times", id, dup, rescues[id])
	}
	require.Len(t, mail, len(f.events), "emails with other Message-IDs: %v", mail)
	for _, k := range afterAccept {
		require.Len(t, mail[messageID(k.eventID)], 2, "killed after its acceptance, the email of %s was sent again", k.eventID)
		require.Equal(t, k.process, mail[messageID(k.eventID)][0])
		require.Positive(t, rescues[k.eventID])
	}
	for _, k := range beforeSend {
		require.NotEqual(t, k.process, mail[messageID(k.eventID)][0], "killed before its send, %s sent the email of %s", k.process, k.eventID)
		require.Positive(t, rescues[k.eventID])
	}
	require.GreaterOrEqual(t, duplicates, len(afterAccept))

	var causes []string
	for s, n := range byCause {
		causes = append(causes, fmt.Sprintf("%s %d", s, n))
	}
	sort.Strings(causes)
	t.Logf("%s: orders %d (each published twice), invoices %d, email jobs %d, emails %d accepted for %d orders, duplicate emails %d "+
		"(each first accepted from a process killed before River recorded its job complete: %s); "+
		"the last process: %d deliveries, %d duplicates skipped",
		path.Base(t.Name()), len(f.events), len(f.events), len(f.events), accepted, len(mail), duplicates, strings.Join(causes, ", "),
		last.Delivered.Load(), last.Skipped.Load())
}

// runChild runs one process of the service until it kills itself with
// SIGKILL at the At-th event of its kind, after writing which event that
// was to its output.
func runChild[TTx any](t *testing.T, s spec, open func(testing.TB, names) backend[TTx]) {
	p := &process[TTx]{name: s.Process, n: s.Names, b: open(t, s.Names)}
	var seen atomic.Int64
	die := func(eventID string) {
		if seen.Add(1) == s.At {
			fmt.Printf("killed %s %s\n", s.Kill, eventID)
			_ = killtest.Kill(context.Background())
		}
	}
	switch s.Kill {
	case killAfterCommit:
		p.hooks.afterCommit = die
	case killBeforeSend:
		p.hooks.beforeSend = die
	case killAfterAccept:
		p.hooks.afterAccept = die
	default:
		t.Fatalf("unknown kill %q", s.Kill)
	}
	p.start(t, false)
	killtest.Linger(t)
}

// fixture is one store's test: PostgreSQL with the service's tables and
// River's schema, a Kafka-protocol broker, and the mailbox.
type fixture[TTx any] struct {
	db      *stdsql.DB
	cluster *kfake.Cluster
	pub     *kafka.Publisher
	mail    *mailbox
	n       names
	b       backend[TTx]
	events  []string // the orders' event ids
}

func setup[TTx any](t *testing.T, open func(testing.TB, names) backend[TTx]) *fixture[TTx] {
	t.Helper()
	ctx := context.Background()
	db := testdb.Postgres(t, "pgx")
	cluster, err := kafkatest.NewCluster()
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	f := &fixture[TTx]{db: db, cluster: cluster, mail: newMailbox(t)}
	f.n = names{
		DSN: testdb.PostgresDSN(), Brokers: cluster.ListenAddrs(), Topic: testdb.Name("orders"),
		Inbox: testdb.Table(t, db, "inbox"), Invoices: testdb.Table(t, db, "invoices"), River: testdb.Name("river"),
		SMTP: f.mail.addr,
	}
	require.NoError(t, cluster.CreateTopic(f.n.Topic, 4, nil))

	// River's tables in a schema of their own, so tests in parallel do not
	// share a queue.
	_, err = db.Exec(`CREATE SCHEMA ` + f.n.River)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP SCHEMA IF EXISTS ` + f.n.River + ` CASCADE`) })
	f.b = open(t, f.n)
	migrator, err := rivermigrate.New(f.b.driver, &rivermigrate.Config{Schema: f.n.River})
	require.NoError(t, err)
	_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	require.NoError(t, err)

	require.NoError(t, f.b.store.CreateSchema(ctx))
	// No unique key: a second invoice for an order would show.
	_, err = db.Exec(`CREATE TABLE ` + f.n.Invoices + ` (id bigserial PRIMARY KEY, order_id text NOT NULL, event_id text NOT NULL, amount_cents bigint NOT NULL)`)
	require.NoError(t, err)

	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	f.pub, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: f.n.Brokers, Marshaler: kafka.DefaultMarshaler{}, OverwriteSaramaConfig: c}, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.pub.Close() })
	return f
}

// publishOrders publishes n new orders, each twice, as a relay that crashed
// after publishing does.
func (f *fixture[TTx]) publishOrders(t testing.TB, n int) {
	t.Helper()
	for range n {
		i := len(f.events) + 1
		payload, err := json.Marshal(order{ID: fmt.Sprintf("order-%d", i), N: i, Customer: fmt.Sprintf("customer-%d@shop.test", i), AmountCents: int64(1000 + i)})
		require.NoError(t, err)
		msg := message.NewMessage(uuid.Must(uuid.NewV7()).String(), payload)
		require.NoError(t, f.pub.Publish(f.n.Topic, msg, msg.Copy()))
		f.events = append(f.events, msg.UUID)
	}
}

var killedAt = regexp.MustCompile(`(?m)^killed (\S+) (\S+)$`)

// kill runs one process of the service as a child until it dies at the
// at-th event of mode, waits until PostgreSQL has ended its transactions,
// and returns the event id it died on.
func (f *fixture[TTx]) kill(t *testing.T, process, mode string, at int64) string {
	t.Helper()
	appName := testdb.Name("jobqueue")
	n := f.n
	n.DSN = killtest.WithAppName(n.DSN, appName)
	out := killtest.Run(t, spec{Names: n, Process: process, Kill: mode, At: at})
	killtest.WaitDisconnected(t, f.db, appName)
	m := killedAt.FindSubmatch(out)
	require.NotNil(t, m, "%s did not say where it died:\n%s", process, out)
	require.Equal(t, mode, string(m[1]))
	return string(m[2])
}

// waitRescuable waits until every job a killed process left running has
// run longer than rescueAfter, so that the next leader's first round
// rescues them all.
func (f *fixture[TTx]) waitRescuable(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.db.QueryRow(`SELECT count(*) FROM `+f.n.River+`.river_job WHERE state = 'running' AND attempted_at > now() - make_interval(secs => $1)`,
			(rescueAfter+time.Second).Seconds()).Scan(&n))
		return n == 0
	}, waitFor, 50*time.Millisecond)
}

// waitDone waits until the consumer group has committed every record of
// the topic (every copy handled and acked), every job is completed, and the
// mailbox has every order's email.
func (f *fixture[TTx]) waitDone(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, p := range f.cluster.PartitionInfos(f.n.Topic) {
			g := f.cluster.GroupInfo("invoicing")
			if g == nil || g.Commits[f.n.Topic][p.Partition].Offset != p.HighWatermark {
				return false
			}
		}
		var open, completed int
		require.NoError(t, f.db.QueryRow(`SELECT count(*) FILTER (WHERE state <> 'completed'), count(*) FILTER (WHERE state = 'completed') FROM `+f.n.River+`.river_job`).Scan(&open, &completed))
		if open > 0 || completed < len(f.events) {
			return false
		}
		mail := f.mail.received()
		return !slices.ContainsFunc(f.events, func(id string) bool { return len(mail[messageID(id)]) == 0 })
	}, waitFor, 50*time.Millisecond, "not everything was consumed, worked and sent")
}

func ones(ids []string) map[string]int {
	m := make(map[string]int, len(ids))
	for _, id := range ids {
		m[id] = 1
	}
	return m
}
