package inbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// onlyClaims is a store that cannot claim in batches.
type onlyClaims struct{ inboxdriver.Store }

// NewBatchConsumer refuses a configuration it cannot honour, naming the
// field.
func TestNewBatchConsumerRefuses(t *testing.T) {
	t.Parallel()
	store, err := sqlinbox.New(testdb.SQLite(t), sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	h := func(context.Context, []*message.Message) error { return nil }
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	for _, tc := range []struct {
		config inbox.BatchConfig
		h      inbox.BatchHandlerFunc
		want   string
	}{
		{inbox.BatchConfig{Store: store, Consumer: "c"}, nil, "handler is nil"},
		{inbox.BatchConfig{Consumer: "c"}, h, "Store is required"},
		{inbox.BatchConfig{Store: onlyClaims{store}, Consumer: "c"}, h, "cannot claim in batches"},
		{inbox.BatchConfig{Store: store}, h, "Consumer is required"},
		{inbox.BatchConfig{Store: store, Consumer: "c", MaxSize: -1}, h, "must not be negative"},
		{inbox.BatchConfig{Store: store, Consumer: "c", PoisonPublisher: pub}, h, "PoisonPublisher and PoisonTopic"},
		{inbox.BatchConfig{Store: store, Consumer: "c\x00"}, h, "Consumer"},
	} {
		_, err := inbox.NewBatchConsumer(tc.config, tc.h)
		require.ErrorContains(t, err, tc.want)
	}
}
