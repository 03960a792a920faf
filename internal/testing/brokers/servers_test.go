package brokers_test

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/internal/testing/effects"
	"github.com/watermill-inbox/inbox/observe"
)

var logger = watermill.NopLogger{}

// env returns the environment variable name, or def.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// The servers the tests use: test.sh exports these when it starts throwaway
// ones.
func amqpURL() string   { return env("INBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }
func natsURL() string   { return env("INBOX_TEST_NATS_URL", "nats://127.0.0.1:4222") }
func redisAddr() string { return env("INBOX_TEST_REDIS_ADDR", "127.0.0.1:6379") }

// deliveries counts what reaches a service, by cause: the predicate of each
// cause says whether a delivery is a redelivery for that reason.
type deliveries struct {
	mu     sync.Mutex
	causes map[string]func(*message.Message) bool
	counts map[string]int
}

func newDeliveries(causes map[string]func(*message.Message) bool) *deliveries {
	return &deliveries{causes: causes, counts: map[string]int{}}
}

// middleware goes in effects.RunConfig.Outer (or wraps what does): it sees
// every delivery.
func (d *deliveries) middleware(next message.HandlerMiddleware) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		if next != nil {
			h = next(h)
		}
		return func(msg *message.Message) ([]*message.Message, error) {
			d.mu.Lock()
			for cause, is := range d.causes {
				if is(msg) {
					d.counts[cause]++
				}
			}
			d.mu.Unlock()
			return h(msg)
		}
	}
}

func (d *deliveries) count(cause string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.counts[cause]
}

func (d *deliveries) String() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return counted(d.counts).String()
}

// counted is a count per cause known without looking at deliveries.
type counted map[string]int

func (c counted) String() string {
	var parts []string
	for cause, n := range c {
		parts = append(parts, fmt.Sprintf("%s %d", cause, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// report logs the numbers the broker tests are judged by, on one line each
// service: deliveries, redeliveries by cause, effects and unique events.
func report(t *testing.T, start time.Time, ids []string, causes fmt.Stringer, services ...*effects.Service) {
	t.Helper()
	unique := map[string]bool{}
	for _, id := range ids {
		unique[id] = true
	}
	for _, s := range services {
		o := s.Outcomes()
		t.Logf("report %s: deliveries %d (redeliveries: %v; inbox: processed %d, duplicate %d, in_flight %d, rolled_back %d), effects %d, unique events %d, %s",
			t.Name(), s.Delivered.Load(), causes, o[observe.Processed], o[observe.Duplicate], o[observe.InFlight],
			o[observe.RolledBack], s.EffectRows(t), len(unique), time.Since(start).Round(time.Millisecond))
	}
}
