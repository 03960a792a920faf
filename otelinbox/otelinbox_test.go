package otelinbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/otelinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

type fixture struct {
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer // the application's own tracer, same provider
	mw     message.HandlerMiddleware
}

// setup builds the middleware; with, if given, changes its inbox.Config.
func setup(t *testing.T, config otelinbox.Config, with ...func(*inbox.Config)) fixture {
	t.Helper()
	db := testdb.Postgres(t, "pgx")
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL, Table: testdb.Table(t, db, "inbox")})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	config.TracerProvider = tp
	ic := inbox.Config{Store: store, Consumer: "billing", Observer: otelinbox.New(config)}
	for _, w := range with {
		w(&ic)
	}
	mw, err := inbox.NewMiddleware(ic)
	require.NoError(t, err)
	return fixture{spans: spans, tracer: tp.Tracer("app"), mw: mw}
}

func event(ctx context.Context, id string) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), nil)
	m.Metadata.Set("event_id", id)
	m.SetContext(ctx)
	return m
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// byName returns the ended spans by name; names must be unique.
func byName(t *testing.T, spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	m := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		require.NotContains(t, m, s.Name())
		m[s.Name()] = s
	}
	return m
}

func TestSpansJoinTheMessageTrace(t *testing.T) {
	t.Parallel()
	f := setup(t, otelinbox.Config{})
	ctx, parent := f.tracer.Start(context.Background(), "receive")
	_, err := f.mw(func(msg *message.Message) ([]*message.Message, error) {
		_, s := f.tracer.Start(msg.Context(), "handler")
		s.End()
		return nil, nil
	})(event(ctx, "e1"))
	require.NoError(t, err)
	parent.End()

	spans := byName(t, f.spans.Ended())
	require.Len(t, spans, 4)
	msg, claim, handler := spans["inbox billing"], spans["inbox claim"], spans["handler"]
	require.NotNil(t, msg)
	require.NotNil(t, claim)
	require.NotNil(t, handler)

	require.Equal(t, parent.SpanContext().SpanID(), msg.Parent().SpanID(), "the inbox span joins the message's trace")
	require.Equal(t, parent.SpanContext().TraceID(), msg.SpanContext().TraceID())
	require.Equal(t, msg.SpanContext().SpanID(), claim.Parent().SpanID())
	require.Equal(t, msg.SpanContext().SpanID(), handler.Parent().SpanID(), "the handler's spans are children of the inbox span")
	require.Equal(t, trace.SpanKindConsumer, msg.SpanKind())

	require.False(t, claim.StartTime().Before(msg.StartTime()))
	require.False(t, claim.EndTime().After(handler.StartTime()), "the claim ends before the handler runs")
	require.False(t, msg.EndTime().Before(handler.EndTime()))

	require.Equal(t, map[attribute.Key]attribute.Value{
		otelinbox.AttrConsumer:  attribute.StringValue("billing"),
		otelinbox.AttrEventID:   attribute.StringValue("e1"),
		otelinbox.AttrOutcome:   attribute.StringValue("processed"),
		otelinbox.AttrDuplicate: attribute.BoolValue(false),
	}, attrs(msg))
	require.Equal(t, codes.Unset, msg.Status().Code)
	require.Equal(t, codes.Unset, claim.Status().Code)
}

func TestDuplicateAndFailureSpans(t *testing.T) {
	t.Parallel()
	f := setup(t, otelinbox.Config{OmitEventID: true})
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	boom := errors.New("boom")

	_, err := f.mw(ok)(event(context.Background(), "e1"))
	require.NoError(t, err)
	_, err = f.mw(ok)(event(context.Background(), "e1"))
	require.NoError(t, err)
	_, err = f.mw(func(*message.Message) ([]*message.Message, error) { return nil, boom })(event(context.Background(), "e2"))
	require.ErrorIs(t, err, boom)
	_, err = f.mw(ok)(event(context.Background(), "bad\x00"))
	require.ErrorIs(t, err, inbox.ErrInvalidEventID)

	var msgs []sdktrace.ReadOnlySpan
	claims := 0
	for _, s := range f.spans.Ended() {
		require.NotContains(t, attrs(s), otelinbox.AttrEventID)
		if s.Name() == "inbox claim" {
			claims++
			continue
		}
		msgs = append(msgs, s)
	}
	require.Equal(t, 3, claims, "no claim for an invalid id")
	require.Len(t, msgs, 4)

	dup := attrs(msgs[1])
	require.Equal(t, "duplicate", dup[otelinbox.AttrOutcome].AsString())
	require.True(t, dup[otelinbox.AttrDuplicate].AsBool())
	require.Equal(t, codes.Unset, msgs[1].Status().Code, "a duplicate is not an error")

	require.Equal(t, "rolled_back", attrs(msgs[2])[otelinbox.AttrOutcome].AsString())
	require.Equal(t, codes.Error, msgs[2].Status().Code)
	require.Equal(t, "boom", msgs[2].Status().Description)
	require.Len(t, msgs[2].Events(), 1, "the error is recorded as an exception event")

	require.Equal(t, "invalid_id", attrs(msgs[3])[otelinbox.AttrOutcome].AsString())
	require.Equal(t, codes.Error, msgs[3].Status().Code)
}

// A processed message whose after-commit hook failed keeps an unset
// status, and carries the failure as an attribute and an exception event.
func TestAfterCommitFailureSpan(t *testing.T) {
	t.Parallel()
	f := setup(t, otelinbox.Config{})
	_, err := f.mw(func(msg *message.Message) ([]*message.Message, error) {
		return nil, inbox.AfterCommit(msg.Context(), func(context.Context) error { panic("hook exploded") })
	})(event(context.Background(), "e1"))
	require.NoError(t, err)
	msg := byName(t, f.spans.Ended())["inbox billing"]
	require.NotNil(t, msg)
	require.Equal(t, "processed", attrs(msg)[otelinbox.AttrOutcome].AsString())
	require.True(t, attrs(msg)[otelinbox.AttrAfterCommitFailed].AsBool())
	require.Equal(t, codes.Unset, msg.Status().Code)
	require.Len(t, msg.Events(), 1)
	require.Contains(t, msg.Events()[0].Attributes, attribute.String("exception.message", "inbox: after-commit hook panicked: hook exploded"))
}

// A stale event processed as usual is marked, the sign that it may have
// been a duplicate the inbox no longer knew.
func TestStaleEventSpan(t *testing.T) {
	t.Parallel()
	f := setup(t, otelinbox.Config{}, func(c *inbox.Config) {
		c.MaxEventAge, c.EventTime = time.Hour, inbox.EventTimeFromMetadata("event_time")
	})
	for _, age := range []time.Duration{time.Minute, 2 * time.Hour} {
		m := event(context.Background(), "e"+age.String())
		m.Metadata.Set("event_time", time.Now().Add(-age).Format(time.RFC3339Nano))
		_, err := f.mw(func(*message.Message) ([]*message.Message, error) { return nil, nil })(m)
		require.NoError(t, err)
	}
	var stale []bool
	for _, s := range f.spans.Ended() {
		if s.Name() == "inbox billing" {
			require.Equal(t, "processed", attrs(s)[otelinbox.AttrOutcome].AsString())
			v, ok := attrs(s)[otelinbox.AttrStale]
			stale = append(stale, ok && v.AsBool())
		}
	}
	require.Equal(t, []bool{false, true}, stale)
}

func TestContextFromMetadata(t *testing.T) {
	t.Parallel()
	f := setup(t, otelinbox.Config{})
	prop := propagation.TraceContext{}
	mw := otelinbox.ContextFromMetadata(prop)
	ok := func(*message.Message) ([]*message.Message, error) { return nil, nil }

	// The producer injects its span into the metadata.
	pctx, producer := f.tracer.Start(context.Background(), "publish")
	msg := event(context.Background(), "e1")
	prop.Inject(pctx, propagation.MapCarrier(msg.Metadata))
	producer.End()
	_, err := mw(f.mw(ok))(msg)
	require.NoError(t, err)
	require.Equal(t, context.Background(), msg.Context(), "the message context is restored")

	// A span already in the context wins over the metadata.
	lctx, local := f.tracer.Start(context.Background(), "receive")
	msg = event(lctx, "e2")
	prop.Inject(pctx, propagation.MapCarrier(msg.Metadata))
	_, err = mw(f.mw(ok))(msg)
	require.NoError(t, err)
	local.End()

	var parents []trace.SpanID
	for _, s := range f.spans.Ended() {
		if s.Name() == "inbox billing" {
			parents = append(parents, s.Parent().SpanID())
		}
	}
	require.Equal(t, []trace.SpanID{producer.SpanContext().SpanID(), local.SpanContext().SpanID()}, parents)
}
