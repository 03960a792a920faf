package brokers_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/sources/natssource"
)

// natsSource is a natssource subscriber pulling topic through the durable
// of the same name, which JetStream redelivers from after ackWait.
func natsSource(t *testing.T, topic string, ackWait time.Duration) message.Subscriber {
	t.Helper()
	sub, err := natssource.NewSubscriber(natssource.Config{URL: natsURL(), NatsOptions: natsOptions(), Durable: topic, AckWait: ackWait, Logger: logger})
	require.NoError(t, err, "no NATS answers at %s (run ./test.sh, which starts one with JetStream)", natsURL())
	return sub
}

// natsLedger is a service on PostgreSQL, a stream and a watermill-nats
// publisher to it.
func natsLedger(t *testing.T) (*effects.Service, string, message.Publisher) {
	t.Helper()
	s := effects.NewService(t, testdb.Postgres(t, "pgx"), "ledger")
	return s, natsStream(t, natsURL(), 1), natsPublisher(t, natsURL())
}
