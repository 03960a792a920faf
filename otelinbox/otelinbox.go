// Package otelinbox traces the inbox with OpenTelemetry: one span per
// message, a child span for its claim, and the outcome (processed,
// duplicate, rolled back...) as attributes and status.
//
//	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Observer: otelinbox.New(otelinbox.Config{})})
//
// The message span is a child of whatever span the message context holds
// when the inbox middleware sees it, and the parent of the handler's spans
// (the observer's context becomes the handler's). A producer's trace usually
// travels in the message metadata (a "traceparent" Kafka header becomes
// metadata through watermill-kafka's marshaler): put [ContextFromMetadata]
// outside the inbox middleware to join it.
//
// It lives in its own package so that only programs importing it link the
// OpenTelemetry API.
package otelinbox

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/watermill-inbox/inbox/observe"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the [trace.Tracer], as
// OpenTelemetry asks: the import path of this package.
const ScopeName = "github.com/watermill-inbox/inbox/otelinbox"

// Attribute keys ([attribute.Key]) set on the message span (consumer, event id,
// outcome, duplicate, stale for an event older than [inbox.Config.MaxEventAge],
// and after_commit_failed when an [inbox.AfterCommit] hook failed) and on the
// claim span (consumer, event id, duplicate).
//
// [inbox.AfterCommit]: https://pkg.go.dev/github.com/watermill-inbox/inbox#AfterCommit
// [inbox.Config.MaxEventAge]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config.MaxEventAge
const (
	AttrConsumer          = attribute.Key("inbox.consumer")
	AttrEventID           = attribute.Key("inbox.event_id")
	AttrOutcome           = attribute.Key("inbox.outcome")
	AttrDuplicate         = attribute.Key("inbox.duplicate")
	AttrStale             = attribute.Key("inbox.stale")
	AttrAfterCommitFailed = attribute.Key("inbox.after_commit_failed")
)

// Config configures [New].
type Config struct {
	// TracerProvider creates the tracer. Defaults to
	// [otel.GetTracerProvider], read once in [New].
	TracerProvider trace.TracerProvider

	// OmitEventID leaves the event id off the spans, for ids that must not
	// reach the tracing backend. Defaults to false: the event id is what one
	// searches traces by when a duplicate is questioned.
	OmitEventID bool
}

// Tracer is an [observe.Observer] that records spans.
type Tracer struct {
	tracer      trace.Tracer
	omitEventID bool
}

var _ observe.Observer = (*Tracer)(nil)

// New returns an [observe.Observer] tracing every message through the inbox.
func New(config Config) *Tracer {
	tp := config.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Tracer{tracer: tp.Tracer(ScopeName), omitEventID: config.OmitEventID}
}

// Start implements [observe.Observer]. The span is named "inbox" at first and
// renamed "inbox <consumer>" when the consumer is known, as the message
// leaves: the consumer may be the handler name or [inbox.Config.Consumer],
// which only the middleware knows.
//
// [inbox.Config.Consumer]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config.Consumer
func (t *Tracer) Start(ctx context.Context) (context.Context, func(observe.Observation)) {
	ctx, span := t.tracer.Start(ctx, "inbox", trace.WithSpanKind(trace.SpanKindConsumer))
	return ctx, func(ob observe.Observation) {
		ids := []attribute.KeyValue{AttrConsumer.String(ob.Consumer)}
		if !t.omitEventID && ob.EventID != "" {
			ids = append(ids, AttrEventID.String(ob.EventID))
		}
		duplicate := AttrDuplicate.Bool(ob.Outcome == observe.Duplicate)
		if !ob.ClaimStart.IsZero() {
			_, claim := t.tracer.Start(ctx, "inbox claim",
				trace.WithTimestamp(ob.ClaimStart),
				trace.WithSpanKind(trace.SpanKindInternal),
				trace.WithAttributes(ids...),
				trace.WithAttributes(duplicate))
			if ob.Outcome == observe.ClaimFailed || ob.Outcome == observe.InFlight {
				setError(claim, ob.Err)
			}
			claim.End(trace.WithTimestamp(ob.ClaimStart.Add(ob.ClaimDuration)))
		}
		if ob.Consumer != "" {
			span.SetName("inbox " + ob.Consumer)
		}
		span.SetAttributes(ids...)
		span.SetAttributes(AttrOutcome.String(string(ob.Outcome)), duplicate)
		if ob.Stale {
			span.SetAttributes(AttrStale.Bool(true))
		}
		if ob.Outcome != observe.Processed && ob.Outcome != observe.Duplicate {
			setError(span, ob.Err)
		}
		if ob.AfterCommitErr != nil {
			// The message was processed, so the status stays unset; the
			// lost hook effect is an exception event on the span.
			span.SetAttributes(AttrAfterCommitFailed.Bool(true))
			span.RecordError(ob.AfterCommitErr)
		}
		span.End()
	}
}

func setError(span trace.Span, err error) {
	if err == nil {
		span.SetStatus(codes.Error, "")
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// ContextFromMetadata returns a middleware that continues the trace carried
// in the message metadata (W3C "traceparent" and friends, as written by
// [propagation.TextMapPropagator.Inject] on the producer side): the span
// context it extracts becomes the parent of the inbox span. A span already in
// the message context (from an instrumented subscriber) wins over the metadata.
// Add it before the inbox middleware. A nil propagator means
// [otel.GetTextMapPropagator], read per message.
func ContextFromMetadata(propagator propagation.TextMapPropagator) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if trace.SpanContextFromContext(msg.Context()).IsValid() {
				return h(msg)
			}
			p := propagator
			if p == nil {
				p = otel.GetTextMapPropagator()
			}
			orig := msg.Context()
			msg.SetContext(p.Extract(orig, propagation.MapCarrier(msg.Metadata)))
			defer msg.SetContext(orig)
			return h(msg)
		}
	}
}
