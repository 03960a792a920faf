package conformancetest

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
)

// A closed pool: an error, the handler never runs.
func testClosedDatabase(t *testing.T, target Target) {
	b := setup(t, target)
	mw, closePool := b.freshMiddleware(t, inbox.Config{Consumer: "c"})
	_, err := call(mw, b.handler(nil), newMsg("warm")) // prepare the claim first
	require.NoError(t, err)
	closePool()
	called := false
	_, err = call(mw, func(*message.Message) ([]*message.Message, error) {
		called = true
		return nil, nil
	}, newMsg("x"))
	require.Error(t, err)
	require.False(t, called)
	require.Equal(t, once("c", "warm"), b.effectCounts(t))
}

// The message context is cancelled while the handler runs (the router is
// shutting down): nothing commits, the message is nacked, and the
// redelivery processes it once.
func testCancelledContextMidHandler(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	ctx, cancel := context.WithCancel(context.Background())
	msg := newMsg("x")
	msg.SetContext(ctx)
	_, err := call(mw, func(msg *message.Message) ([]*message.Message, error) {
		if err := b.writeEffect(msg); err != nil {
			return nil, err
		}
		cancel()
		return nil, nil
	}, msg)
	require.Error(t, err)
	require.Empty(t, b.effectCounts(t))
	require.Zero(t, b.claims(t))

	_, err = call(mw, b.handler(nil), newMsg("x"))
	require.NoError(t, err)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
}

// A handler that writes, ignores a failed statement and returns nil. Where
// the failure poisons the transaction (PostgreSQL), the commit must fail and
// the message be nacked rather than acked with nothing committed. Where the
// transaction survives it (MySQL, SQLite), the claim and the write commit
// together and the redelivery is a duplicate.
func testSwallowedStatementError(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	_, err := call(mw, func(msg *message.Message) ([]*message.Message, error) {
		require.NoError(t, b.writeEffect(msg))
		sqlErr := b.exec(msg.Context(), "SELECT * FROM no_such_table_anywhere")
		require.Error(t, sqlErr)
		return nil, nil // swallowed
	}, newMsg("x"))
	if target.FailedStatementAbortsTx {
		require.Error(t, err)
		require.Zero(t, b.claims(t))
		require.Empty(t, b.effectCounts(t))
		return
	}
	require.NoError(t, err)
	require.Equal(t, 1, b.claims(t))
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	_, err = call(mw, b.handler(nil), newMsg("x"))
	require.NoError(t, err)
	require.Equal(t, once("c", "x"), b.effectCounts(t))
	require.Equal(t, 1, b.attemptsOf("x"))
}

// A handler's own error is not transient for its Go type: an
// io.ErrUnexpectedEOF from a truncated payload, also after a failed
// statement (which aborts a PostgreSQL transaction), is the handler's. The
// claim's connection answers the middleware's probe; nothing commits.
func testHandlerErrorOfAnOutagesType(t *testing.T, target Target) {
	b := setup(t, target)
	mw := b.middleware(t, inbox.Config{Consumer: "c"})
	for _, failedStatement := range []bool{false, true} {
		_, err := call(mw, func(msg *message.Message) ([]*message.Message, error) {
			require.NoError(t, b.writeEffect(msg))
			if failedStatement {
				require.Error(t, b.exec(msg.Context(), "SELECT * FROM no_such_table_anywhere"))
			}
			return nil, fmt.Errorf("decoding the order: %w", io.ErrUnexpectedEOF)
		}, newMsg("x"))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
		require.False(t, inbox.IsTransient(err), "after a failed statement: %t: %v", failedStatement, err)
	}
	require.Zero(t, b.claims(t))
	require.Empty(t, b.effectCounts(t))
}
