package peek_test

import (
	"reflect"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/peek"
)

// The forwarder's Publisher, as Watermill (this module's version) makes
// it, is looked through to the publisher it wraps; a struct of the same
// name elsewhere is not.
func TestForwarderWrapped(t *testing.T) {
	t.Parallel()
	inner := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = inner.Close() })
	fwd := forwarder.NewPublisher(inner, forwarder.PublisherConfig{ForwarderTopic: "forwarder"})
	wrapped, ok := peek.ForwarderWrapped(reflect.ValueOf(fwd).Elem())
	require.True(t, ok, "forwarder.Publisher still keeps the publisher it wraps in wrappedPublisher")
	require.True(t, holds(wrapped, inner))

	type Publisher struct{ wrappedPublisher any }
	_, ok = peek.ForwarderWrapped(reflect.ValueOf(Publisher{wrappedPublisher: inner}))
	require.False(t, ok)
}
