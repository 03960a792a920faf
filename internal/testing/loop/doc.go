// Package loop holds the end-to-end tests of the complete loop: a service
// writes its events to a watermill-sql outbox in its business transaction, a
// relay publishes them to Kafka at least once, and consumers behind the inbox
// middleware apply each event's effect exactly once while writing their own
// follow-up events to their own outbox in the same transaction.
//
// The tests run a real Kafka-protocol broker in-process (kfake), Sarama
// through watermill-kafka, watermill-sql v3 and v4 on PostgreSQL and
// MariaDB, and inject each cause of duplicate delivery: a relay that
// publishes twice, a consumer killed between its commit and its offset
// commit, a consumer-group rebalance, an operator replaying a topic, and
// rows that commit out of their insert order under a relay that must not
// skip them. Every test asserts exact effect counts in the database. The
// package has no code of its own.
package loop
