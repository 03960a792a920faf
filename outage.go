package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
)

// probeTimeout bounds each probe after a handler failed: a connection, or a
// database, silent that long counts as gone.
const probeTimeout = 5 * time.Second

// outage sorts the error of a handler (or of the produced publisher) that
// failed in tx by evidence, never by its Go type: an io.EOF may be a closed
// socket or a truncated payload, a net.Error the database or a mistyped URL.
// It is transient when the message's context was cancelled (the router
// closing), when the store recognises its database's code for going away
// ([inboxdriver.UnavailableDetector]), or when the claim's own connection
// no longer answers ([inboxdriver.TxProber]) for a reason the handler did
// not cause. Otherwise it is the handler's own error, which [IsTransient]
// reports only under a [Transient] mark.
func (e *engine) outage(ctx context.Context, tx inboxdriver.Tx, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return Transient(err)
	}
	if d, ok := e.store.(inboxdriver.UnavailableDetector); ok && d.IsUnavailable(err) {
		return Transient(err)
	}
	p, ok := e.store.(inboxdriver.TxProber)
	if !ok {
		return handlerError{err}
	}
	gone := probe(ctx, func(ctx context.Context) error { return p.ProbeTx(ctx, tx) })
	if gone == nil {
		return handlerError{err}
	}
	// The drivers discard a connection whose statement a context
	// cancelled: after the handler's own timeout, only the database
	// answering on another connection tells it from an outage. The claim
	// can only roll back now; ending it first gives its place in the pool
	// to the probe, which a pool of one would not have.
	if d, ok := e.store.(inboxdriver.DBProber); ok && cancelled(d, err) {
		_ = probe(ctx, tx.Rollback)
		if probe(ctx, d.ProbeDB) == nil {
			return handlerError{err}
		}
	}
	return Transient(fmt.Errorf("%w (the claim's connection no longer answers: %v)", err, gone))
}

// probe runs f without the message's cancellation, for at most
// probeTimeout.
func probe(ctx context.Context, f func(context.Context) error) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeTimeout)
	defer cancel()
	return f(pctx)
}

// cancelled reports whether err is a statement cancelled by the handler: by
// a context it derived (the error, or its text where a wrapper dropped the
// chain) or by a timeout its session set.
func cancelled(d inboxdriver.DBProber, err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || d.IsCancelled(err) {
		return true
	}
	text := err.Error()
	return strings.Contains(text, context.DeadlineExceeded.Error()) || strings.Contains(text, context.Canceled.Error())
}
