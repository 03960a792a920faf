package natssource_test

import (
	"strings"
	"testing"

	"github.com/watermill-inbox/inbox/sources/natssource"
)

// NewSubscriber refuses a configuration it cannot honour, before it
// connects.
func TestNewSubscriberRefuses(t *testing.T) {
	for _, tc := range []struct {
		config natssource.Config
		want   string
	}{
		{natssource.Config{Durable: "ledger"}, "URL is required"},
		{natssource.Config{URL: "nats://127.0.0.1:4222"}, "Durable is required"},
		{natssource.Config{URL: "nats://127.0.0.1:4222", Durable: "ledger", MaxAckPending: -1}, "must not be negative"},
	} {
		_, err := natssource.NewSubscriber(tc.config)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("NewSubscriber(%+v) = %v, want an error with %q", tc.config, err, tc.want)
		}
	}
}
