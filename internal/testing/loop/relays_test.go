package loop_test

import (
	stdsql "database/sql"
	"fmt"
	"testing"
	"time"

	wsqlv3 "github.com/ThreeDotsLabs/watermill-sql/v3/pkg/sql"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// outboxConfig is one way to build an outbox and its relay, as
// docs/outbox.md tells users: the database, the watermill-sql version of
// the publisher that writes in the claim's transaction, and the relay's
// subscriber.
type outboxConfig struct {
	name  string
	mysql bool // MariaDB, else PostgreSQL
	// publisher writes to the SQL topic through tx.
	publisher func(tx *stdsql.Tx) (message.Publisher, error)
	// relay is the relay's subscriber; its SubscribeInitialize creates
	// the outbox's tables.
	relay func(db *stdsql.DB) (subscriber, error)
	// pending is the query of the rows the relay has not acked yet, for
	// the topic's tables.
	pending func(topic string) string
	// drop drops the topic's tables.
	drop func(topic string) string
}

// subscriber is what watermill-sql v3 and v4 subscribers have in common.
type subscriber interface {
	message.Subscriber
	SubscribeInitialize(topic string) error
}

// relayPoll keeps the relays' polling short.
var relayPoll = struct{ poll, resend, retry time.Duration }{20 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond}

// The configurations docs/outbox.md recommends, per database and
// watermill-sql version.
var (
	postgresV4 = outboxConfig{
		name: "postgresql-v4",
		publisher: func(tx *stdsql.Tx) (message.Publisher, error) {
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultPostgreSQLSchema{}}, logger)
		},
		relay: func(db *stdsql.DB) (subscriber, error) {
			return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
				ConsumerGroup: "relay", PollInterval: relayPoll.poll, ResendInterval: relayPoll.resend, RetryInterval: relayPoll.retry,
				SchemaAdapter:  wsql.DefaultPostgreSQLSchema{},
				OffsetsAdapter: wsql.DefaultPostgreSQLOffsetsAdapter{},
			}, logger)
		},
		pending: postgresPending,
		drop:    postgresDrop,
	}
	postgresV3 = outboxConfig{
		name: "postgresql-v3",
		publisher: func(tx *stdsql.Tx) (message.Publisher, error) {
			return wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultPostgreSQLSchema{}}, logger)
		},
		relay: func(db *stdsql.DB) (subscriber, error) {
			return wsqlv3.NewSubscriber(db, wsqlv3.SubscriberConfig{
				ConsumerGroup: "relay", PollInterval: relayPoll.poll, ResendInterval: relayPoll.resend, RetryInterval: relayPoll.retry,
				SchemaAdapter:  wsqlv3.DefaultPostgreSQLSchema{},
				OffsetsAdapter: wsqlv3.DefaultPostgreSQLOffsetsAdapter{},
			}, logger)
		},
		pending: postgresPending,
		drop:    postgresDrop,
	}
	// On MariaDB the relay is v4's queue: acked rows are deleted, so a row
	// that commits below one already relayed is still found. v4.1's
	// subscriber hands the whole batch to the queue's AckMessageQuery when
	// it stops mid-batch, so the relay reads queueBatch rows with no
	// AckDeadline and is closed through inbox.RelaySubscriber
	// (TestQueueRelayStoppedMidBatch).
	mariadbV4 = outboxConfig{
		name: "mariadb-v4", mysql: true,
		publisher: func(tx *stdsql.Tx) (message.Publisher, error) {
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.MySQLQueueSchema{}}, logger)
		},
		relay:   mysqlQueueRelay(queueBatch),
		pending: mysqlQueuePending,
		drop:    mysqlDrop,
	}
	// watermill-sql v3 has no queue schema: its DefaultMySQLSchema
	// publisher inserts the same columns into the queue's table, which the
	// v4 relay reads.
	mariadbV3 = outboxConfig{
		name: "mariadb-v3", mysql: true,
		publisher: func(tx *stdsql.Tx) (message.Publisher, error) {
			return wsqlv3.NewPublisher(tx, wsqlv3.PublisherConfig{SchemaAdapter: wsqlv3.DefaultMySQLSchema{}}, logger)
		},
		relay:   mysqlQueueRelay(queueBatch),
		pending: mysqlQueuePending,
		drop:    mysqlDrop,
	}
)

// The MariaDB configuration docs/outbox.md recommended before: the default
// MySQL schema and its offsets adapter, which skip a row that commits
// below an offset the relay already acked.
var (
	mariadbV3Offsets = outboxConfig{
		name: "mariadb-v3-offsets", mysql: true,
		publisher: mariadbV3.publisher,
		relay: func(db *stdsql.DB) (subscriber, error) {
			return wsqlv3.NewSubscriber(db, wsqlv3.SubscriberConfig{
				ConsumerGroup: "relay", PollInterval: relayPoll.poll, ResendInterval: relayPoll.resend, RetryInterval: relayPoll.retry,
				SchemaAdapter:  wsqlv3.DefaultMySQLSchema{},
				OffsetsAdapter: wsqlv3.DefaultMySQLOffsetsAdapter{},
			}, logger)
		},
		pending: mysqlOffsetsPending,
		drop:    mysqlDrop,
	}
	mariadbV4Offsets = outboxConfig{
		name: "mariadb-v4-offsets", mysql: true,
		publisher: func(tx *stdsql.Tx) (message.Publisher, error) {
			return wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, logger)
		},
		relay: func(db *stdsql.DB) (subscriber, error) {
			return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
				ConsumerGroup: "relay", PollInterval: relayPoll.poll, ResendInterval: relayPoll.resend, RetryInterval: relayPoll.retry,
				SchemaAdapter:  wsql.DefaultMySQLSchema{},
				OffsetsAdapter: wsql.DefaultMySQLOffsetsAdapter{},
			}, logger)
		},
		pending: mysqlOffsetsPending,
		drop:    mysqlDrop,
	}
)

// queueBatch is the batch docs/outbox.md recommends for the queue relay.
const queueBatch = 100

// mysqlQueueRelay is a v4 queue relay reading batch rows at a time, no
// consumer group (the queue schema has none), acked rows deleted, no
// AckDeadline.
func mysqlQueueRelay(batch int) func(db *stdsql.DB) (subscriber, error) {
	return func(db *stdsql.DB) (subscriber, error) {
		noDeadline := time.Duration(0)
		return wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
			PollInterval: relayPoll.poll, ResendInterval: relayPoll.resend, RetryInterval: relayPoll.retry, AckDeadline: &noDeadline,
			SchemaAdapter:  wsql.MySQLQueueSchema{SubscribeBatchSize: batch},
			OffsetsAdapter: wsql.MySQLQueueOffsetsAdapter{DeleteOnAck: true},
		}, logger)
	}
}

func postgresPending(topic string) string {
	return fmt.Sprintf(`SELECT count(*) FROM "watermill_%[1]s" m WHERE NOT EXISTS (SELECT FROM "watermill_offsets_%[1]s" o
		WHERE (m.transaction_id, m."offset") <= (o.last_processed_transaction_id, o.offset_acked))`, topic)
}

func mysqlQueuePending(topic string) string {
	return fmt.Sprintf("SELECT count(*) FROM `watermill_%s` WHERE NOT acked", topic)
}

func mysqlOffsetsPending(topic string) string {
	return fmt.Sprintf("SELECT count(*) FROM `watermill_%[1]s` WHERE `offset` > COALESCE((SELECT MAX(offset_acked) FROM `watermill_offsets_%[1]s`), 0)", topic)
}

func postgresDrop(topic string) string {
	return fmt.Sprintf(`DROP TABLE IF EXISTS "watermill_%[1]s", "watermill_offsets_%[1]s"`, topic)
}

func mysqlDrop(topic string) string {
	return fmt.Sprintf("DROP TABLE IF EXISTS `watermill_%[1]s`, `watermill_offsets_%[1]s`", topic)
}

// open opens the configuration's database.
func (c outboxConfig) open(t testing.TB) *stdsql.DB {
	t.Helper()
	if c.mysql {
		return testdb.MySQL(t)
	}
	return testdb.Postgres(t, "pgx")
}

// dialect is the inbox store's dialect on the configuration's database.
func (c outboxConfig) dialect() sqlinbox.Dialect {
	if c.mysql {
		return sqlinbox.MySQL
	}
	return sqlinbox.PostgreSQL
}

// pendingRows counts the rows of topic the relay has not acked.
func (c outboxConfig) pendingRows(t testing.TB, db *stdsql.DB, topic string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(c.pending(topic)).Scan(&n))
	return n
}
