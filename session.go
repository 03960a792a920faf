package inbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/errtext"
)

// session is what the middleware puts in the message context for the
// duration of one handler call.
type session struct {
	e        *engine // the middleware that opened it
	tx       StoreTx // the claim's transaction, as the store made it
	consumer string
	eventID  string

	mu    sync.Mutex
	hooks []func(context.Context) error
	ended bool

	msg         *message.Message // the message the session was opened for
	txTaken     atomic.Bool      // the handler asked for the transaction
	txNotNeeded atomic.Bool      // the handler declared it writes nothing in SQL
	calls       atomic.Int32     // handler calls through [Handler]
}

type sessionKey struct{}

// sessionFrom returns the session of the message whose context is ctx, or
// nil outside an inbox transaction.
func sessionFrom(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// afterCommit registers fn to run after the session's commit. Once the
// transaction has ended it returns [ErrTxEnded]: fn would never run.
func (s *session) afterCommit(fn func(context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return ErrTxEnded
	}
	s.hooks = append(s.hooks, fn)
	return nil
}

// end closes the session to new hooks and returns those registered.
func (s *session) end() []func(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	hooks := s.hooks
	s.hooks = nil
	return hooks
}

// markTxTaken records that the handler took the session's transaction.
func (s *session) markTxTaken() { s.txTaken.Store(true) }

// markTxNotNeeded records that the handler deliberately writes nothing in
// SQL.
func (s *session) markTxNotNeeded() { s.txNotNeeded.Store(true) }

// enterHandler counts a handler call through [Handler] and refuses the
// second one within the session.
func (s *session) enterHandler() error {
	if n := s.calls.Add(1); n > 1 {
		return errCalledTwice(s, n)
	}
	return nil
}

// errCalledTwice is the error of a session whose handler was called n times:
// a middleware between the inbox and the handler repeats calls.
func errCalledTwice(s *session, n int32) error {
	return fmt.Errorf("%w: the handler was called %d times in one inbox transaction (consumer %q, event %s): a middleware between the inbox and the handler repeats calls (Retry, Duplicator); those writes would all commit together", ErrMiswired, n, s.consumer, errtext.Quote(s.eventID))
}
