package galera_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/dbserver"
	"github.com/watermill-inbox/inbox/internal/testing/stream"
)

// The cost's workload: rounds of messages with new event ids, each round
// running every deployment and mode once, in an order that rotates.
const (
	costRounds  = 5
	costWorkers = 6
)

// costMessages is the messages of each deployment and mode in a round:
// fewer under the race detector, which slows the client, so that the suite
// stays short (the figures in the docs come from a build without it).
var costMessages = map[bool]int{false: 1000, true: 300}[slices.Contains(testdb.BuildFlags, "-race")]

// deployment is where the cost is measured: workers spread over targets.
type deployment struct {
	name    string
	targets []*stream.Target
	mws     []message.HandlerMiddleware
}

// mode is bare (the effect in a transaction of its own) or inbox.
type mode int

const (
	bare mode = iota
	withInbox
)

func (m mode) String() string { return [...]string{"bare", "inbox"}[m] }

// What the inbox costs on one Galera node and across three, beside a single
// MariaDB server started alike, in the same run: messages per second of
// costWorkers workers, each message one effect row in one transaction,
// bare or behind the inbox, with new event ids (no duplicates). Medians of
// costRounds rounds with their range; ratios are taken within each round.
func testCost(t *testing.T, cluster *dbserver.Galera) {
	single := dbserver.StartMariaDB(t, dbserver.GaleraServerOptions...)
	var deps []*deployment
	add := func(name string, dsns ...string) {
		d := &deployment{name: name}
		tables := stream.NewTables()
		for _, dsn := range dsns {
			tg := stream.Open(t, "mysql", dsn, tables, costWorkers)
			mw, err := inbox.NewMiddleware(inbox.Config{Store: tg.Store, Consumer: stream.Consumer})
			require.NoError(t, err)
			d.targets, d.mws = append(d.targets, tg), append(d.mws, mw)
		}
		d.targets[0].CreateTables(t)
		deps = append(deps, d)
	}
	add("single MariaDB", single.DSN())
	add("one Galera node", cluster.Nodes[0].DSN())
	add("three Galera nodes", cluster.Nodes[0].DSN(), cluster.Nodes[1].DSN(), cluster.Nodes[2].DSN())

	// A warm-up round, not measured: pools filled, each node's consumer
	// registered (on Galera, the first registrations of a consumer on
	// several nodes at once conflict too, and are retried).
	for _, d := range deps {
		for _, m := range []mode{bare, withInbox} {
			d.run(t, m, -1, 50)
		}
	}
	rates := map[string][]float64{} // "deployment/mode" -> per round
	for round := range costRounds {
		for i := range len(deps) * 2 {
			k := (i + round) % (len(deps) * 2)
			d, m := deps[k/2], mode(k%2)
			took := d.run(t, m, round, costMessages)
			rates[d.name+"/"+m.String()] = append(rates[d.name+"/"+m.String()], float64(costMessages)/took.Seconds())
		}
	}

	var report strings.Builder
	fmt.Fprintf(&report, "%d rounds of %d messages, %d workers; medians [min-max] of messages/s, and of ratios within a round; %d attempts retried after a conflict:",
		costRounds, costMessages, costWorkers, conflictRetries.Load())
	ratio := func(a, b []float64) []float64 {
		out := make([]float64, len(a))
		for i := range a {
			out[i] = a[i] / b[i]
		}
		return out
	}
	base := deps[0].name
	for _, d := range deps {
		b, in := rates[d.name+"/bare"], rates[d.name+"/inbox"]
		fmt.Fprintf(&report, "\n  %-19s bare %s, inbox %s, inbox/bare %s", d.name+":", spread(b, "%.0f"), spread(in, "%.0f"), spread(ratio(in, b), "%.2f"))
		if d.name != base {
			fmt.Fprintf(&report, "; beside a single MariaDB: bare %s, inbox %s",
				spread(ratio(b, rates[base+"/bare"]), "%.2f"), spread(ratio(in, rates[base+"/inbox"]), "%.2f"))
		}
	}
	t.Log(report.String())

	// Every message behind the inbox committed its claim and its effect.
	for _, d := range deps {
		var effects, claims int
		db := d.targets[0].DB
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+d.targets[0].Effects+` WHERE event_id LIKE 'inbox-%' AND event_id NOT LIKE 'inbox--1-%'`).Scan(&effects))
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+d.targets[0].Inbox+` WHERE event_id LIKE 'inbox-%' AND event_id NOT LIKE 'inbox--1-%'`).Scan(&claims))
		require.Equal(t, costRounds*costMessages, effects, "%s: effects behind the inbox", d.name)
		require.Equal(t, costRounds*costMessages, claims, "%s: claims", d.name)
	}
}

// run handles n messages in mode m with costWorkers workers, worker w on
// target w modulo the targets, and returns how long it took.
func (d *deployment) run(t *testing.T, m mode, round, n int) time.Duration {
	t.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, costWorkers)
	start := time.Now()
	for w := range costWorkers {
		tg := d.targets[w%len(d.targets)]
		handle := d.mws[w%len(d.targets)](func(msg *message.Message) ([]*message.Message, error) {
			id, _, _ := inbox.EventIDFromContext(msg.Context())
			return nil, tg.WriteEffect(msg.Context(), id)
		})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				id := fmt.Sprintf("%s-%d-%d", m, round, i)
				if err := d.handle(ctx, tg, handle, m, id); err != nil {
					errs <- fmt.Errorf("%s, %s, event %s: %w", d.name, m, id, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return took
}

// conflictRetries counts the attempts of the cost's messages that a
// certification conflict failed, and that were retried.
var conflictRetries atomic.Int64

// handle handles one message until no certification conflict fails it, as
// a router redelivers: bare, the effect in a transaction of its own; with
// the inbox, the claim and the effect in one.
func (d *deployment) handle(ctx context.Context, tg *stream.Target, handle message.HandlerFunc, m mode, id string) error {
	for {
		err := d.attempt(ctx, tg, handle, m, id)
		if !certificationConflict(err) {
			return err
		}
		conflictRetries.Add(1)
	}
}

func (d *deployment) attempt(ctx context.Context, tg *stream.Target, handle message.HandlerFunc, m mode, id string) error {
	if m == withInbox {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		msg.Metadata.Set("event_id", id)
		_, err := handle(msg)
		return err
	}
	tx, err := tg.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+tg.Effects+` (event_id) VALUES (?)`, id); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// spread formats the median of xs and its range.
func spread(xs []float64, format string) string {
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf(format+" ["+format+"-"+format+"]", med, s[0], s[len(s)-1])
}
