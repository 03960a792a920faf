package watermillsql_test

import (
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/internal/testing/wsqltest"
)

type counterSpec struct {
	Rig wsqltest.Rig
	// Accessor is how the handler reaches its transaction: "watermill-sql"
	// (the subscriber's sql.TxFromContext, as Watermill's example does) or
	// "inbox" (inbox.TxFromContext).
	Accessor string
	// DieAfter is the handler call that kills the process, DieWhere where:
	// "committed" right after the inbox commit (before watermill-sql commits
	// its own transaction with the offset), "handler" after the handler's
	// writes (before the inbox commit).
	DieAfter int64
	DieWhere string
}

// counterHandler is Watermill's exactly-once-delivery-counter handler: it
// reads the counter and writes value+1 (and logs the event) through the
// transaction accessor picks.
func counterHandler(r *wsqltest.Rig, accessor string, calls *atomic.Int64, after func(msg *message.Message, call int64)) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		n := calls.Add(1)
		var tx *sql.Tx
		var ok bool
		if accessor == "watermill-sql" {
			tx, ok = r.SubscriberTx(msg.Context())
		} else {
			tx, ok = inbox.TxFromContext(msg.Context())
		}
		if !ok {
			return errors.New("no transaction in the message context")
		}
		if err := r.Count(msg.Context(), tx, msg.UUID); err != nil {
			return err
		}
		if after != nil {
			after(msg, n)
		}
		return nil
	}
}

// The exactly-once-delivery-counter under the inbox: every event published
// three times through watermill-sql, consumers SIGKILLed mid-stream (real
// child processes) after the inbox committed and before watermill-sql
// committed its offset, or before the inbox committed, and restarted; at
// the end the counter equals the number of events and each event's effect
// is there once. Handlers write through watermill-sql's TxFromContext, as
// Watermill's example does, or through inbox.TxFromContext.
//
// The test binary runs itself as the consumers (killtest): there,
// this test is the consumer that kills itself.
func TestCounterThroughKills(t *testing.T) {
	var spec counterSpec
	if killtest.Child(&spec) {
		runCounterChild(t, spec)
		return
	}
	t.Parallel()
	const events, copies = 40, 3
	kills := []struct {
		after int64
		where string
	}{{7, "committed"}, {5, "handler"}, {9, "committed"}}
	for _, c := range []struct {
		f        wsqltest.Flavour
		accessor string
	}{
		{wsqltest.Flavour{Version: 4}, "watermill-sql"},
		{wsqltest.Flavour{Version: 3}, "inbox"},
		{wsqltest.Flavour{Version: 3, MySQL: true}, "watermill-sql"},
		{wsqltest.Flavour{Version: 4, MySQL: true}, "inbox"},
	} {
		t.Run(c.f.String()+"-"+c.accessor, func(t *testing.T) {
			t.Parallel()
			r := wsqltest.New(t, c.f)
			r.PublishCopies(t, events, copies)
			for _, k := range kills {
				killtest.Run(t, counterSpec{Rig: *r, Accessor: c.accessor, DieAfter: k.after, DieWhere: k.where})
			}

			// The last consumer, in this process, takes the rest.
			var calls, deliveries atomic.Int64
			countDeliveries := func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					deliveries.Add(1)
					return h(msg)
				}
			}
			logs := watermill.NewCaptureLogger()
			mw, err := inbox.NewMiddleware(inbox.Config{Store: r.Store(t), Logger: logs})
			require.NoError(t, err)
			stop := wsqltest.RunRouter(t, r.Subscriber(t), r.Topic, counterHandler(r, c.accessor, &calls, nil), countDeliveries, mw)
			r.WaitDrained(t)
			stop()

			require.Equal(t, wsqltest.Exactly(events), r.Outcome(t))
			// Writing through watermill-sql's accessor is taking the
			// transaction: no report of a handler that went around it.
			require.Empty(t, logs.Captured()[watermill.ErrorLogLevel])
			t.Logf("%d events, %d copies published, %d consumers killed; the last consumer got %d deliveries and handled %d; counter %d, effects %d",
				events, events*copies, len(kills), deliveries.Load(), calls.Load(), events, events)
		})
	}
}

func runCounterChild(t *testing.T, spec counterSpec) {
	r := &spec.Rig
	r.Attach(t)
	var calls atomic.Int64
	handler := counterHandler(r, spec.Accessor, &calls, func(msg *message.Message, n int64) {
		if n != spec.DieAfter {
			return
		}
		if spec.DieWhere == "handler" {
			_ = killtest.Kill(msg.Context())
		}
		_ = inbox.AfterCommit(msg.Context(), killtest.Kill)
	})
	wsqltest.RunRouter(t, r.Subscriber(t), r.Topic, handler, middlewareFor(t, r))
	time.Sleep(wsqltest.WaitFor)
	t.Fatalf("the consumer handled %d messages and was not killed", calls.Load())
}
