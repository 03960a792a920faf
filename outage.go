package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// probeTimeout bounds the probe of a claim's connection after a handler
// failed: a connection silent that long counts as gone.
const probeTimeout = 5 * time.Second

// outage sorts the error of a handler (or of the produced publisher) that
// failed in tx by evidence, never by its Go type: an io.EOF may be a closed
// socket or a truncated payload, a net.Error the database or a mistyped URL.
// It is transient when the message's context was cancelled (the router
// closing), when the store recognises its database's code for going away
// ([inboxdriver.UnavailableDetector]), or when the claim's own connection
// no longer answers ([inboxdriver.TxProber]). Otherwise it is the handler's
// own error, which [IsTransient] reports only under a [Transient] mark.
func (e *engine) outage(ctx context.Context, tx inboxdriver.Tx, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return Transient(err)
	}
	if d, ok := e.store.(inboxdriver.UnavailableDetector); ok && d.IsUnavailable(err) {
		return Transient(err)
	}
	if p, ok := e.store.(inboxdriver.TxProber); ok {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
		defer cancel()
		if gone := p.ProbeTx(pctx, tx); gone != nil {
			return Transient(fmt.Errorf("%w (the claim's connection no longer answers: %v)", err, gone))
		}
	}
	return handlerError{err}
}
