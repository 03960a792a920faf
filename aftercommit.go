package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/session"
)

// runHooks runs the session's after-commit hooks in order and returns
// their failures. A hook that fails or panics loses only its own effect:
// the transaction has committed, so the message is still processed and
// acked, and the hooks after it still run.
func runHooks(ctx context.Context, s *session.Session, logger watermill.LoggerAdapter) error {
	hooks := s.End()
	if len(hooks) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	var errs []error
	for _, fn := range hooks {
		stack, err := runHook(ctx, fn)
		if err == nil {
			continue
		}
		fields := watermill.LogFields{"consumer": s.Consumer, "event_id": s.EventID}
		if stack != nil {
			fields["stack"] = string(stack)
		}
		logger.Error("Inbox: after-commit hook failed; its effect is lost for this event", err, fields)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// runHook calls fn, turning a panic into an error, with the panic's stack.
func runHook(ctx context.Context, fn func(context.Context) error) (stack []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			stack, err = debug.Stack(), fmt.Errorf("inbox: after-commit hook panicked: %v", r)
		}
	}()
	return nil, fn(ctx)
}
