//lint:file-ignore SA4006 the snippet shows the calls without their error checks, which the test adds after them

package docs_test

import (
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The Vitess section's configuration: a store with a shard key column and a
// middleware that takes the key from the message. Nothing connects; the
// Vitess tests run it through vtgate.
func TestDatabasesVitessConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(vtgate.invalid:3306)/commerce") // opened lazily, never used
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })

	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.MySQL, ShardKeyColumn: "shard_key"})
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, ShardKey: func(msg *message.Message) (string, error) {
		return msg.Metadata.Get("customer_id"), nil // the producer's, the same on every copy
	}})

	require.NoError(t, err)
	require.NotNil(t, mw)
	require.Equal(t, "shard_key", store.ShardKeyColumn())
}
