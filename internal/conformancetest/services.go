package conformancetest

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/observe"
)

// Two services with one consumer name on one table: the first to claim
// owns it, the other's messages are refused with ErrMiswired
// (OutcomeMiswired) and one error line naming both services, its handler
// never called; a replica of the owner on a pool of its own processes,
// and the other service does too once its consumer has a name of its own.
func testConsumerOwnedByAnotherService(t *testing.T, target Target) {
	b := setup(t, target)
	billingLog, mailerLog := watermill.NewCaptureLogger(), watermill.NewCaptureLogger()
	mailerObs := &outcomes{}
	billing := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/billing", Logger: billingLog})
	mailer := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/mailer", Logger: mailerLog, Observer: mailerObs})
	orders := ids("order", 3)
	for _, id := range orders {
		_, err := call(billing, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	for range 2 { // a redelivery is refused alike, and not logged again
		for _, id := range orders {
			_, err := call(mailer, func(*message.Message) ([]*message.Message, error) {
				t.Error("the handler of a consumer owned by another service was called")
				return nil, nil
			}, newMsg(id))
			require.ErrorIs(t, err, inbox.ErrMiswired)
			require.ErrorContains(t, err, `consumer "handle_orders" of this inbox table belongs to service "example.com/billing", and this is service "example.com/mailer"`)
		}
	}
	require.Equal(t, 6, mailerObs.count(observe.Miswired))
	logs := mailerLog.Captured()[watermill.ErrorLogLevel]
	require.Len(t, logs, 1, "one error line per consumer")
	require.ErrorIs(t, logs[0].Err, inbox.ErrMiswired)
	require.Equal(t, "example.com/billing", logs[0].Fields["owner"])
	require.Contains(t, logs[0].Msg, "set inbox.Config.Consumer")
	require.Empty(t, billingLog.Captured()[watermill.ErrorLogLevel])

	// A replica of billing, as another process would be.
	replica, closePool := b.freshMiddleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/billing"})
	defer closePool()
	for _, id := range append(orders, "order-3") {
		_, err := call(replica, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	// mailer under a name of its own.
	renamed := b.middleware(t, inbox.Config{Consumer: "mailer.handle_orders", Service: "example.com/mailer", Logger: mailerLog})
	for _, id := range orders {
		_, err := call(renamed, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	want := once("handle_orders", append(orders, "order-3")...)
	for k, v := range once("mailer.handle_orders", orders...) {
		want[k] = v
	}
	require.Equal(t, want, b.effectCounts(t))
	require.Len(t, mailerLog.Captured()[watermill.ErrorLogLevel], 1)
}

// A table whose registry is missing (made by an earlier release, migrated
// without the registry) still processes, and says once per consumer what
// to run; CreateSchema then adds the registry, which checks again.
func testConsumerRegistryMissing(t *testing.T, target Target) {
	b := setup(t, target)
	_, err := b.db.Exec("DROP TABLE " + b.store.RegistryTable())
	require.NoError(t, err)
	logger := watermill.NewCaptureLogger()
	mw := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/mailer", Logger: logger})
	for _, id := range ids("order", 2) {
		_, err := call(mw, b.handler(nil), newMsg(id))
		require.NoError(t, err)
	}
	require.Equal(t, once("handle_orders", ids("order", 2)...), b.effectCounts(t))
	logs := logger.Captured()[watermill.ErrorLogLevel]
	require.Len(t, logs, 1)
	require.ErrorIs(t, logs[0].Err, inbox.ErrNoConsumerRegistry)
	require.ErrorContains(t, logs[0].Err, b.store.RegistryTable()+"; run Store.CreateSchema")

	require.NoError(t, b.store.CreateSchema(context.Background()))
	other := b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/billing"})
	_, err = call(other, b.handler(nil), newMsg("order-9"))
	require.NoError(t, err, "the first service to register owns the consumer")
	_, err = call(b.middleware(t, inbox.Config{Consumer: "handle_orders", Service: "example.com/mailer"}), b.handler(nil), newMsg("order-9"))
	require.ErrorIs(t, err, inbox.ErrMiswired)
}
