// Package brokers holds the end-to-end tests of the inbox behind the brokers
// Watermill users run besides Kafka: RabbitMQ through watermill-amqp, NATS
// JetStream through watermill-nats (one server, and a three-node cluster that
// loses its stream leader), and Redis Streams through watermill-redisstream.
//
// Each test injects that broker's own causes of redelivery (a requeueing
// nack, a consumer SIGKILLed with unacknowledged deliveries, an ack after
// AckWait, a pending entry claimed after its idle time, a publisher retrying
// after a lost confirm) and ends by counting effects from PostgreSQL: exactly
// one per unique event. The event id tests check, for every marshaler, that
// the id a producer gave an event survives the hop. The workers tests scale
// one handler on one queue each way a user would (inbox.Subscriptions, the
// handler under several names) and fan one topic out to two consumers.
//
// The servers come from the environment (INBOX_TEST_AMQP_URL,
// INBOX_TEST_NATS_URL, INBOX_TEST_REDIS_ADDR), defaulting to local ones; the
// repository's test.sh starts throwaway servers when none answers. The
// cluster test starts its own nodes from the nats-server binary. The package
// has no code of its own.
package brokers
