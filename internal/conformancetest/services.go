package conformancetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

// Two services claiming with one consumer name on one table at the same
// time share one claim per event, so each event runs in only one of them.
// Which service a process belongs to is a guess, so this is loud and never
// blocking: both keep processing, and the one that finds the other's live
// lease warns once (observe.SharedConsumer, on every message while it
// lasts). A service alone on its consumer, a replica of it, or the other
// service under a name of its own, never warns.
func testConsumerSharedByTwoServices(t *testing.T, target Target) {
	b := setup(t, target)
	billingLog, mailerLog := NewLogger(), NewLogger()
	mailerObs := &outcomes{}
	billing := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/billing", Logger: billingLog})
	_, err := call(billing, b.handler(nil), newMsg("order-0"))
	require.NoError(t, err)
	b.awaitLease(t, "handle_orders", "example.com/billing")

	replica, closePool := b.freshMiddleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/billing", Logger: billingLog})
	defer closePool()
	mailer := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/mailer", Logger: mailerLog, Observer: mailerObs})
	deadline := time.Now().Add(30 * time.Second)
	n := 0
	for ; mailerObs.warned(observe.SharedConsumer) < 3 && time.Now().Before(deadline); n++ {
		id := fmt.Sprintf("order-%d", n+1)
		_, err := call(replica, b.handler(nil), newMsg(id))
		require.NoError(t, err)
		_, err = call(mailer, func(*message.Message) ([]*message.Message, error) {
			t.Error("the other service's claim of the event was not seen")
			return nil, nil
		}, newMsg(id))
		require.NoError(t, err, "a suspicion never refuses a message")
	}
	require.Equal(t, n, mailerObs.warned(observe.SharedConsumer), "the shared consumer is warned about on every message, the first included")
	require.Equal(t, mailerObs.count(observe.Duplicate), n, "every message of the mailer was processed, as a duplicate of billing's")
	require.Empty(t, mailerLog.Errors(), "a suspicion is not an error")
	logs := mailerLog.Warnings()
	require.Len(t, logs, 1, "one warning per consumer")
	require.Equal(t, string(observe.SharedConsumer), logs[0].Fields["warning"])
	require.Contains(t, logs[0].Msg, "example.com/billing")
	for _, l := range billingLog.Warnings() { // billing, replica included, may warn of the mailer, never of itself
		require.Equal(t, "example.com/mailer", l.Fields["others"], "a replica is not another service")
	}

	// The mailer under a name of its own never warns.
	ownObs := &outcomes{}
	own := b.middleware(t, inbox.Config{Consumer: "mailer.handle_orders", Service: "example.com/mailer", Observer: ownObs})
	for i := range 3 {
		_, err := call(own, b.handler(nil), newMsg(fmt.Sprintf("order-%d", i)))
		require.NoError(t, err)
	}
	require.Zero(t, ownObs.warned(observe.SharedConsumer))
	require.Equal(t, 3, ownObs.count(observe.Processed))
}

// A table whose lease table is missing (migrated without it, or the
// application's role granted the inbox table only) still processes: the
// check degrades to unchecked, said once per consumer.
func testLeaseTableMissing(t *testing.T, target Target) {
	b := setup(t, target)
	_, err := b.db.Exec("DROP TABLE " + b.store.LeaseTable())
	require.NoError(t, err)
	logger := NewLogger()
	mw := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/mailer", Logger: logger})
	orders := ids("order", 3)
	for _, id := range orders {
		_, err := call(mw, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	require.Equal(t, once("handle_orders", orders...), b.effectCounts(t))
	require.Empty(t, logger.Errors())
	logs := logger.Warnings()
	require.Len(t, logs, 1, "logged once")
	require.Equal(t, string(observe.Unchecked), logs[0].Fields["warning"])
	require.Contains(t, logs[0].Fields["reason"], b.store.LeaseTable())
}

// awaitLease waits until service holds a lease on consumer.
func (b *bundle) awaitLease(t *testing.T, consumer, service string) {
	t.Helper()
	q := fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE consumer = %s AND service = %s", b.store.LeaseTable(), b.target.Placeholder(1), b.target.Placeholder(2))
	require.Eventually(t, func() bool {
		var n int
		return b.db.QueryRow(q, consumer, service).Scan(&n) == nil && n > 0
	}, 10*time.Second, 10*time.Millisecond, "the lease of %s on %s", service, consumer)
}
