package main

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// A short run of every mode from each broker: the program works end to
// end, every event has its effect once in every run (run checks it), and
// the batches from the sources fill. Its rates mean nothing at this length.
func TestSmoke(t *testing.T) {
	t.Parallel()
	for name, b := range brokers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := run(context.Background(), options{
				broker: b, amqpURL: env("INBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), natsURL: env("INBOX_TEST_NATS_URL", "nats://127.0.0.1:4222"),
				dsn: testdb.PostgresDSN(), events: 300, rounds: 1, replicas: 2, size: 100, wait: time.Second, out: &out, progress: io.Discard,
			})
			require.NoError(t, err, out.String())
			for _, want := range []string{b.name, "inbox ", "batch ", "bare ", "batch / inbox", "batch / bare"} {
				require.Contains(t, out.String(), want)
			}
			require.Regexp(t, `(?m)^batch +\d+ .* 100 +$`, out.String(), "a batch of 100 was reached")
		})
	}
}
