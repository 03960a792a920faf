package conformancetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// HandlerDeadline is the deadline a handler puts on one statement that may
// hang, and SlowStatement a statement that always outlasts it.
const HandlerDeadline = 100 * time.Millisecond

// SlowStatement returns a statement of dialect that runs for a second or
// more, ten times [HandlerDeadline].
func SlowStatement(dialect sqlinbox.Dialect) string {
	switch dialect {
	case sqlinbox.PostgreSQL:
		return `SELECT pg_sleep(1)`
	case sqlinbox.MySQL:
		return `SELECT SLEEP(1)`
	}
	return `WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000000) SELECT count(*) FROM n`
}

// A handler bounds one statement with a deadline of its own, and this
// message's statement is always too slow. The drivers discard the
// connection whose statement a context cancelled, but the database still
// answers: the timeout is the handler's own error, retried, then poisoned,
// so that it cannot block an ordered partition for good. Behind the
// README's stack: exactly 1+ReadmeRetries calls, then the poison queue,
// nothing committed. On PostgreSQL, a statement_timeout the handler sets is
// its own error too.
func testHandlerDeadlineIsItsOwn(t *testing.T, target Target) {
	cases := map[string]func(msg *message.Message, b *bundle) error{
		"context deadline": func(msg *message.Message, b *bundle) error {
			ctx, cancel := context.WithTimeout(msg.Context(), HandlerDeadline)
			defer cancel()
			return b.exec(ctx, SlowStatement(target.Dialect))
		},
	}
	if target.Dialect == sqlinbox.PostgreSQL {
		cases["statement_timeout"] = func(msg *message.Message, b *bundle) error {
			if err := b.exec(msg.Context(), `SET LOCAL statement_timeout = 100`); err != nil {
				return err
			}
			return b.exec(msg.Context(), SlowStatement(target.Dialect))
		}
	}
	for name, slow := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, target)
			var calls atomic.Int64
			s := NewReadmeStack(t, b.middleware(t, inbox.Config{}), inbox.BackoffConfig{InitialInterval: 10 * time.Millisecond}, watermill.NopLogger{}, func(msg *message.Message) error {
				calls.Add(1)
				if err := b.writeEffect(msg); err != nil {
					return err
				}
				if err := slow(msg, b); err != nil {
					return err
				}
				return errors.New("the slow statement ended within the deadline")
			})
			s.DeliverWithin(t, newMsg("x"), 30*time.Second)
			require.EqualValues(t, 1+ReadmeRetries, calls.Load(), "the handler's calls: the retry budget")
			require.Len(t, s.Poisoned(), 1)
			for _, err := range s.Returned() { // a claim may wait for the last attempt's statement to end
				require.True(t, !inbox.IsTransient(err) || errors.Is(err, inbox.ErrInFlight), "an attempt classed transient: %v", err)
			}
			require.Empty(t, b.effectCounts(t))
			require.Zero(t, b.claims(t))
		})
	}
}
