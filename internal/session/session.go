// Package session is the state of one message inside the inbox transaction,
// reachable from its context: shared by the middleware, which opens it, and
// the stores' accessors (inbox.TxFromContext, pgxinbox.TxFromContext), which
// hand its transaction to the handler.
package session

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// Session lives for one handler call.
type Session struct {
	Tx       inboxdriver.Tx // the claim's transaction, as the store made it
	Consumer string
	EventID  string
	Msg      *message.Message // the message the session was opened for

	// Reporter is told, by [As], of a handler asking an accessor for a
	// transaction of a kind the store does not hand out.
	Reporter Reporter

	mu    sync.Mutex
	hooks []func(context.Context) error
	ended bool

	txTaken     atomic.Bool  // the handler asked for the transaction
	wrongKind   atomic.Bool  // the handler asked an accessor of another kind of store
	txNotNeeded atomic.Bool  // the handler declared it writes nothing in SQL
	calls       atomic.Int32 // handler calls through inbox.Handler
}

// Reporter is told of a handler asking an accessor for a transaction of a
// kind the store does not hand out.
type Reporter interface {
	WrongAccessor(s *Session, accessor string)
}

type key struct{}

// With returns ctx carrying s.
func With(ctx context.Context, s *Session) context.Context {
	return context.WithValue(ctx, key{}, s)
}

// From returns the session of the message whose context is ctx, or nil
// outside an inbox transaction.
func From(ctx context.Context) *Session {
	s, _ := ctx.Value(key{}).(*Session)
	return s
}

// As returns the transaction of ctx's session when its handle is a T, for
// the accessor named accessor; a handle of another kind is reported to
// [Session.WrongAccessor]. Only a transaction returned counts as taken.
func As[T any](ctx context.Context, accessor string) (tx T, ok bool) {
	s := From(ctx)
	if s == nil {
		return tx, false
	}
	if tx, ok = s.Tx.Handle().(T); !ok {
		s.wrongKind.Store(true)
		if s.Reporter != nil {
			s.Reporter.WrongAccessor(s, accessor)
		}
		return tx, false
	}
	s.MarkTxTaken()
	return tx, true
}

// AfterCommit registers fn to run after the commit. Once the transaction
// has ended it returns false: fn would never run.
func (s *Session) AfterCommit(fn func(context.Context) error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return false
	}
	s.hooks = append(s.hooks, fn)
	return true
}

// End closes the session to new hooks and returns those registered.
func (s *Session) End() []func(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = true
	hooks := s.hooks
	s.hooks = nil
	return hooks
}

// MarkTxTaken records that the handler took the transaction.
func (s *Session) MarkTxTaken() { s.txTaken.Store(true) }

// TxTaken reports whether the handler took the transaction.
func (s *Session) TxTaken() bool { return s.txTaken.Load() }

// MarkTxNotNeeded records that the handler deliberately writes nothing in
// SQL.
func (s *Session) MarkTxNotNeeded() { s.txNotNeeded.Store(true) }

// TxNotNeeded reports [Session.MarkTxNotNeeded].
func (s *Session) TxNotNeeded() bool { return s.txNotNeeded.Load() }

// EnterHandler counts a handler call and returns how many there were.
func (s *Session) EnterHandler() int32 { return s.calls.Add(1) }

// Calls returns how many handler calls [Session.EnterHandler] counted.
func (s *Session) Calls() int32 { return s.calls.Load() }

// WrongAccessor reports whether the handler asked an accessor for a kind of
// transaction the store does not hand out.
func (s *Session) WrongAccessor() bool { return s.wrongKind.Load() }
