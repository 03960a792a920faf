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
	"github.com/watermill-inbox/inbox/internal/testdb"
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

// DeadlineDuringAnOutage proves that a handler's deadline that fires while
// the database does not answer is still an outage. mw's store reaches its
// database of dialect through proxy; exec runs a statement in the inbox
// transaction of ctx's message. The network stalls under the handler's
// slow statement and its own deadline fires. The drivers that honour it
// (pgx, go-sql-driver/mysql) drop the connection and return, and the
// middleware sorts the attempt during the stall; lib/pq waits for an
// answer until the connection is cut. Then the connections are cut and new
// ones refused until the attempt has been sorted. Behind the
// README's stack the message is waited out in place, never poisoned, and
// the second call, once the database is back, processes it.
func DeadlineDuringAnOutage(t *testing.T, proxy *testdb.Proxy, mw message.HandlerMiddleware, dialect sqlinbox.Dialect, exec func(ctx context.Context, query string) error) {
	t.Helper()
	var calls atomic.Int64
	deadlines := make(chan context.Context, 1)
	returned := make(chan struct{})
	s := NewReadmeStack(t, mw, inbox.BackoffConfig{InitialInterval: 10 * time.Millisecond, MaxInterval: 100 * time.Millisecond}, watermill.NopLogger{}, func(msg *message.Message) error {
		if calls.Add(1) > 1 {
			return exec(msg.Context(), `SELECT 1`)
		}
		ctx, cancel := context.WithTimeout(msg.Context(), HandlerDeadline)
		defer cancel()
		proxy.Stall()
		deadlines <- ctx
		defer close(returned)
		return exec(ctx, SlowStatement(dialect))
	})
	outage := make(chan struct{})
	go func() {
		defer close(outage)
		ctx := <-deadlines
		<-ctx.Done()
		select {
		case <-returned:
		case <-time.After(3 * time.Second): // lib/pq
		}
		proxy.Down()
		for end := time.Now().Add(time.Minute); len(s.Returned()) == 0 && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
		proxy.Up()
	}()
	s.DeliverWithin(t, newMsg("x"), time.Minute)
	<-outage
	require.EqualValues(t, 2, calls.Load(), "the handler's calls")
	require.Empty(t, s.Poisoned())
	attempts := s.Returned()
	require.NotEmpty(t, attempts)
	t.Logf("the attempt under the outage: %v", attempts[0])
	require.True(t, inbox.IsTransient(attempts[0]), "the attempt under the outage is not transient: %v", attempts[0])
	require.NoError(t, attempts[len(attempts)-1])
}
