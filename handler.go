package inbox

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/session"
)

// Handler wraps h in the inbox middleware mw (from [NewMiddleware]), for
// [message.Router.AddHandler]. The inbox is then the innermost layer by
// construction: every middleware added to the router or to the handler, in
// any order, wraps it from outside, so a Retry gets a new transaction per
// attempt and a PoisonQueue sees the rollback.
//
// The returned function refuses, with [ErrMiswired], to call h outside an
// inbox transaction (mw is not the inbox) or twice in one transaction.
func Handler(mw message.HandlerMiddleware, h message.HandlerFunc) message.HandlerFunc {
	return handler(mw, h, funcID(h))
}

// handler is [Handler] for a function whose [funcID] is id: the context
// tells the middleware, which sees only this closure, what runs inside
// (workers.go).
func handler(mw message.HandlerMiddleware, h message.HandlerFunc, id uintptr) message.HandlerFunc {
	wrapped := mw(func(msg *message.Message) ([]*message.Message, error) {
		s := session.From(msg.Context())
		if s == nil {
			return nil, fmt.Errorf("%w: inbox.Handler was given a middleware that is not the inbox", ErrMiswired)
		}
		if n := s.EnterHandler(); n > 1 {
			return nil, errCalledTwice(s, n)
		}
		return h(msg)
	})
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.SetContext(context.WithValue(msg.Context(), handlerIDKey{}, id))
		return wrapped(msg)
	}
}

// ConsumerHandler is [Handler] for [message.Router.AddConsumerHandler], whose
// handlers return no messages.
func ConsumerHandler(mw message.HandlerMiddleware, h message.NoPublishHandlerFunc) message.NoPublishHandlerFunc {
	wrapped := handler(mw, func(msg *message.Message) ([]*message.Message, error) {
		return nil, h(msg)
	}, funcID(h))
	return func(msg *message.Message) error {
		_, err := wrapped(msg)
		return err
	}
}
