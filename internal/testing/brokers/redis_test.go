package brokers_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/internal/testing/killtest"
	"github.com/watermill-inbox/inbox/observe"
)

// redisClient returns a client of its own: a watermill-redisstream
// subscriber closes its client when it closes.
func redisClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	require.NoError(t, c.Ping(context.Background()).Err(), "no Redis answers at %s (run ./test.sh, which starts one)", addr)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// redisStream returns a unique stream name; the stream is deleted at the end.
func redisStream(t *testing.T) string {
	t.Helper()
	name := testdb.Name("orders")
	c := redisClient(t, redisAddr())
	t.Cleanup(func() { _ = c.Del(context.Background(), name).Err() })
	return name
}

func redisPublisher(t *testing.T) *redisstream.Publisher {
	t.Helper()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redisClient(t, redisAddr())}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// redisMaxIdle is how long an entry stays pending with a consumer before
// another consumer of the group claims it (watermill-redisstream's
// MaxIdleTime; its default is a minute).
const redisMaxIdle = time.Second

// redisSubscriber is consumer name of the group "billing"; it claims
// entries idle for redisMaxIdle, looking every 100ms.
func redisSubscriber(t testing.TB, addr, name string) *redisstream.Subscriber {
	t.Helper()
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client:                        redisClient(t, addr),
		Consumer:                      name,
		ConsumerGroup:                 "billing",
		ClaimInterval:                 100 * time.Millisecond,
		MaxIdleTime:                   redisMaxIdle,
		BlockTime:                     50 * time.Millisecond,
		DisableIndefiniteInitialBlock: true,
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// A consumer process of the group is SIGKILLed right after its 15th commit.
// The entries it read and did not acknowledge stay pending in its name; a
// consumer of the same group claims them (XCLAIM) once they have been idle
// for MaxIdleTime. The one whose effect committed is a duplicate.
func TestRedisPendingEntriesClaimed(t *testing.T) {
	if killtest.ConsumeUntilKilled(t, func(c killtest.Consumer) message.Subscriber {
		return redisSubscriber(t, c.Server, "doomed")
	}) {
		return
	}
	t.Parallel()
	start := time.Now()
	ctx := context.Background()
	db := testdb.Postgres(t, "pgx")
	stream := redisStream(t)
	ids := effects.PublishEvents(t, redisPublisher(t), stream, 40)
	billing := effects.NewService(t, db, "billing")

	committed := killtest.KillConsumer(t, billing, redisAddr(), stream, 15)
	require.Equal(t, 15, committed, "one message at a time")

	// What the dead consumer read and did not acknowledge.
	c := redisClient(t, redisAddr())
	pending, err := c.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "billing", Start: "-", End: "+", Count: 100}).Result()
	require.NoError(t, err)
	require.NotEmpty(t, pending)
	pendingIDs := map[string]bool{}
	for _, p := range pending {
		require.Equal(t, "doomed", p.Consumer)
		entries, err := c.XRange(ctx, stream, p.ID, p.ID).Result()
		require.NoError(t, err)
		require.Len(t, entries, 1)
		pendingIDs[entries[0].Values[redisstream.UUIDHeaderKey].(string)] = true
	}

	causes := newDeliveries(map[string]func(*message.Message) bool{
		"claimed after idle time": func(msg *message.Message) bool { return pendingIDs[msg.UUID] },
	})
	billing.Run(t, redisSubscriber(t, redisAddr(), "survivor"), stream, effects.RunConfig{Outer: causes.middleware(nil)})
	require.Eventually(t, func() bool {
		n, err := c.XPending(ctx, stream, "billing").Result()
		require.NoError(t, err)
		return n.Count == 0 && billing.Handled.Load() == int64(len(ids)-committed)
	}, effects.WaitFor, 20*time.Millisecond)
	billing.RequireExactlyOnce(t, ids)

	// Once each, unless a handler on a loaded machine takes longer than
	// MaxIdleTime and its entry is claimed again.
	require.GreaterOrEqual(t, causes.count("claimed after idle time"), len(pending), "every pending entry was claimed")
	require.GreaterOrEqual(t, billing.Outcomes()[observe.Duplicate], int64(1), "the entry committed before the kill was skipped")
	t.Logf("child committed %d effects and left %d entries pending", committed, len(pending))
	report(t, start, ids, causes, billing)
}
