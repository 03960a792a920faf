package watermillsql_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testing/wsqltest"
)

// A batch handler writes one follow-up event per message to a watermill-sql
// outbox on the batch's transaction. Its first call fails after writing
// them: they roll back with the claims, the halves commit, and the
// redelivered batch writes nothing more: one outbox row per event.
func TestBatchOutboxInTheBatchTransaction(t *testing.T) {
	t.Parallel()
	wsqltest.EachFlavour(t, func(t *testing.T, r *wsqltest.Rig) {
		var calls atomic.Int32
		c, err := inbox.NewBatchConsumer(inbox.BatchConfig{Store: r.Store(t), Consumer: "batch"}, func(ctx context.Context, msgs []*message.Message) error {
			tx, ok := inbox.TxFromContext(ctx)
			if !ok {
				return inbox.ErrNotInInbox
			}
			pub, err := r.TxPublisher(tx)
			if err != nil {
				return err
			}
			for _, msg := range msgs {
				if err := pub.Publish(r.Topic, message.NewMessage(watermill.NewUUID(), []byte(`"`+msg.Metadata.Get("event_id")+`"`))); err != nil {
					return err
				}
			}
			if calls.Add(1) == 1 {
				return errors.New("fails after publishing")
			}
			return nil
		})
		require.NoError(t, err)
		batch := func() []*message.Message {
			var msgs []*message.Message
			for _, id := range []string{"e-1", "e-2", "e-3", "e-2", "e-4", "e-5"} {
				msg := message.NewMessage(watermill.NewUUID(), nil)
				msg.Metadata.Set(inbox.DefaultEventIDMetadataKey, id)
				msgs = append(msgs, msg)
			}
			return msgs
		}
		require.NoError(t, c.Process(context.Background(), batch()))
		require.Equal(t, int32(3), calls.Load(), "the failed batch, then its halves")
		require.Equal(t, 5, r.Rows(t))
		require.NoError(t, c.Process(context.Background(), batch()))
		require.Equal(t, int32(3), calls.Load(), "the redelivery is all duplicates")
		require.Equal(t, 5, r.Rows(t))
	})
}
