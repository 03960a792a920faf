// Package kafkatest runs a real Kafka-protocol broker in process (kfake) and
// holds the Sarama settings that let watermill-kafka consumer groups form,
// rebalance and commit in milliseconds against it, for the tests, the soak
// and the benchmark.
package kafkatest

import (
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Group timings. The broker accepts session timeouts down to
// MinSessionTimeout, so a member that dies is noticed in SessionTimeout
// rather than Kafka's default 45 seconds.
const (
	MinSessionTimeout = 500 * time.Millisecond
	SessionTimeout    = 2 * time.Second
	HeartbeatInterval = 100 * time.Millisecond
)

// NewCluster starts a one-broker cluster that accepts SessionTimeout.
func NewCluster(opts ...kfake.Opt) (*kfake.Cluster, error) {
	return kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(MinSessionTimeout)}, opts...)...)
}

// SubscriberConfig returns watermill-kafka's subscriber defaults with short
// group timings, reading from the oldest offset. rebalanceTimeout bounds how
// long a rebalance waits for members to rejoin.
func SubscriberConfig(rebalanceTimeout time.Duration) *sarama.Config {
	c := kafka.DefaultSaramaSubscriberConfig()
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	// Without it, a synchronous offset commit waits behind the fetch
	// long-poll (500ms by default).
	c.Consumer.MaxWaitTime = 50 * time.Millisecond
	c.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	c.Consumer.Group.Session.Timeout = SessionTimeout
	c.Consumer.Group.Heartbeat.Interval = HeartbeatInterval
	c.Consumer.Group.Rebalance.Timeout = rebalanceTimeout
	c.Consumer.Group.Rebalance.Retry.Backoff = 100 * time.Millisecond
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	return c
}
