package loop_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/testdb"
)

// docs/outbox.md's move from the default MySQL relay to the queue, step by
// step, on a table the old relay skipped a row of: the row that committed
// below the offset it had acked is relayed by the queue, and so is every
// row younger than the next inbox's retention (duplicates, which that inbox
// drops); a row older than that is not, since its inbox row may be gone.
func TestMoveToQueueRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.MySQL(t)
	topic := testdb.Name("invoices")
	table := fmt.Sprintf("`watermill_%s`", topic)
	t.Cleanup(func() { _, _ = db.Exec(mysqlDrop(topic)) })
	old, err := mariadbV4Offsets.relay(db)
	require.NoError(t, err)
	require.NoError(t, old.SubscribeInitialize(topic))

	pub, err := wsql.NewPublisher(wsql.BeginnerFromStdSQL(db), wsql.PublisherConfig{SchemaAdapter: wsql.DefaultMySQLSchema{}}, logger)
	require.NoError(t, err)
	var ids []string
	for i := range 6 {
		msg := message.NewMessage(fmt.Sprintf("%s-%d", topic, i), []byte(`{}`))
		ids = append(ids, msg.UUID)
		require.NoError(t, pub.Publish(topic, msg))
	}
	// Row 3 commits late: the old relay acks row 6 before it is there.
	var skipped struct {
		offset          int64
		uuid, meta, pay string
	}
	require.NoError(t, db.QueryRow("SELECT `offset`, uuid, payload, metadata FROM "+table+" WHERE uuid = ?", ids[2]).
		Scan(&skipped.offset, &skipped.uuid, &skipped.pay, &skipped.meta))
	_, err = db.Exec("DELETE FROM "+table+" WHERE `offset` = ?", skipped.offset)
	require.NoError(t, err)
	// An old row, older than the next inbox's retention (14 days here).
	_, err = db.Exec("UPDATE "+table+" SET created_at = NOW() - INTERVAL 20 DAY WHERE uuid = ?", ids[0])
	require.NoError(t, err)

	relayed := func(sub subscriber, until func() bool) map[string]bool {
		t.Helper()
		got := map[string]bool{}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		deadline := time.After(waitFor)
		for !until() {
			select {
			case msg := <-msgs:
				got[msg.UUID] = true
				msg.Ack()
			case <-time.After(relayPoll.poll):
			case <-deadline:
				t.Fatal("the relay did not drain the outbox")
			}
		}
		require.NoError(t, sub.Close())
		return got
	}
	got := relayed(old, func() bool { return mariadbV4Offsets.pendingRows(t, db, topic) == 0 })
	require.Len(t, got, 5, "the old relay published every row there")
	_, err = db.Exec("INSERT INTO "+table+" (`offset`, uuid, payload, metadata) VALUES (?, ?, ?, ?)",
		skipped.offset, skipped.uuid, skipped.pay, skipped.meta)
	require.NoError(t, err)
	require.Zero(t, mariadbV4Offsets.pendingRows(t, db, topic), "the old relay will never read the late row")

	// The move: the old relay is stopped; add acked, delete what is older
	// than the retention less a day, start the queue relay.
	for _, stmt := range []string{
		"ALTER TABLE " + table + " ADD COLUMN acked BOOLEAN NOT NULL DEFAULT FALSE",
		"DELETE FROM " + table + " WHERE created_at < NOW() - INTERVAL 13 DAY",
	} {
		_, err := db.Exec(stmt)
		require.NoError(t, err)
	}
	queue, err := mariadbV4.relay(db)
	require.NoError(t, err)
	got = relayed(queue, func() bool { return mariadbV4.pendingRows(t, db, topic) == 0 })
	require.Equal(t, map[string]bool{ids[1]: true, ids[2]: true, ids[3]: true, ids[4]: true, ids[5]: true}, got,
		"the skipped row and every row younger than the retention, none older")
}
