package amqpsource_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "modernc.org/sqlite"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/sources/amqpsource"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// Full batches from RabbitMQ: 250 events published by a watermill-amqp
// publisher, consumed in batches of up to 100 by a BatchConsumer reading
// through amqpsource.
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dir, _ := os.MkdirTemp("", "amqpsource")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite", sqlinbox.SQLiteDSN(filepath.Join(dir, "inbox.db")))
	defer db.Close()
	store, _ := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	_ = store.CreateSchema(ctx)
	queue := fmt.Sprintf("payments_%d", time.Now().UnixNano())
	pub, _ := wamqp.NewPublisher(wamqp.NewDurableQueueConfig(amqpURL()), watermill.NopLogger{})
	defer pub.Close()

	sub, err := amqpsource.NewSubscriber(amqpsource.Config{URL: amqpURL(), Prefetch: 200})
	if err != nil {
		panic(err)
	}
	defer sub.Close()
	var (
		mu      sync.Mutex
		sizes   []int
		handled int
	)
	consumer, _ := inbox.NewBatchConsumer(inbox.BatchConfig{Store: store, Consumer: "ledger", MaxSize: 100, MaxWait: 2 * time.Second},
		func(ctx context.Context, msgs []*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			sizes = append(sizes, len(msgs))
			if handled += len(msgs); handled == 250 {
				_ = inbox.AfterCommit(ctx, func(context.Context) error { stop(); return nil })
			}
			inbox.TxNotNeeded(ctx)
			return nil
		})
	defer declareQueue(queue)()
	for range 250 {
		_ = pub.Publish(queue, message.NewMessage(watermill.NewUUID(), nil))
	}

	err = consumer.Run(ctx, sub, queue)
	fmt.Println(err, "batches:", sizes)
	// Output: context canceled batches: [100 100 50]
}
