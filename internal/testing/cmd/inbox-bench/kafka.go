package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/watermill-inbox/inbox/internal/testing/bench"
	"github.com/watermill-inbox/inbox/internal/testing/kafkatest"
)

// kafkaEndToEnd measures the whole path through Kafka: an in-process
// Kafka-protocol broker (kfake), a topic of c partitions holding n new
// events, and a router consuming it with the handler bare or behind the
// inbox. The rate runs from the first message handled to the last, so the
// consumer group's join is left out; c partitions give c handlers at once.
func kafkaEndToEnd(ctx context.Context, o options, modes []mode) error {
	cluster, err := kafkatest.NewCluster()
	if err != nil {
		return err
	}
	defer cluster.Close()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: cluster.ListenAddrs(), Marshaler: kafka.DefaultMarshaler{},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()

	for _, c := range o.conc {
		rates := make([][]float64, len(modes))
		for round := range o.rounds {
			for i, m := range modes {
				if round%2 == 1 {
					m = modes[len(modes)-1-i]
					i = len(modes) - 1 - i
				}
				r, err := kafkaRun(ctx, cluster, pub, c, o.kafka, m.h)
				if err != nil {
					return fmt.Errorf("kafka %s: %w", m.name, err)
				}
				rates[i] = append(rates[i], r)
			}
		}
		tw := tabwriter.NewWriter(o.out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "kafka, %d partitions\tmsgs/s\tratio\t\n", c)
		for i, m := range modes {
			ratios := make([]float64, len(rates[i]))
			for r := range ratios {
				ratios[r] = rates[i][r] / rates[0][r]
			}
			fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t\n", m.name, median(rates[i]), median(ratios))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// kafkaRun publishes n new events to a fresh topic and returns the rate at
// which a router handles them with h.
func kafkaRun(ctx context.Context, cluster *kfake.Cluster, pub message.Publisher, partitions, n int, h message.HandlerFunc) (float64, error) {
	topic := bench.Name("bench")
	if err := cluster.CreateTopic(topic, int32(partitions), nil); err != nil {
		return 0, err
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), nil)
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		return 0, err
	}

	// Short group timings: each run joins a new group.
	cfg := kafkatest.SubscriberConfig(kafkatest.SessionTimeout)
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: cluster.ListenAddrs(), Unmarshaler: kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: cfg, ConsumerGroup: topic,
	}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var first, last time.Time
	handled := 0
	done := make(chan struct{})
	router.AddConsumerHandler("bench", topic, sub, func(msg *message.Message) error {
		if _, err := h(msg); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		if handled == 0 {
			first = now
		}
		handled++
		last = now
		if handled == n {
			close(done)
		}
		return nil
	})
	go func() { _ = router.Run(ctx) }()
	defer router.Close()
	select {
	case <-done:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(5*time.Minute + time.Duration(n)*10*time.Millisecond):
		return 0, errors.New("timed out waiting for every message")
	}
	return float64(n-1) / last.Sub(first).Seconds(), nil
}
