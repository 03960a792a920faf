package bench

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// BatchHandler handles one batch of messages.
type BatchHandler func(ctx context.Context, msgs []*message.Message) error

// BatchConn is a [Conn] that also handles batches, one transaction each.
type BatchConn interface {
	// BareBatch writes every message of a batch in one transaction of its
	// own, without the inbox: what a batch consumer without the inbox does.
	BareBatch(w Write) BatchHandler
	// InboxBatch runs the same write through inbox.BatchConsumer.Process on
	// the inbox table of c, with the Consumer of Inbox.
	InboxBatch(c sqlinbox.Config, w Write) (BatchHandler, error)
}

// execBatch runs w for every id: one statement for a write that has a
// batch form, else w's statements per id.
func (w Write) execBatch(ctx context.Context, ids []string, exec func(ctx context.Context, query string, args ...any) error) error {
	if w.batch == nil {
		sets := make([][][]any, len(ids))
		for i, id := range ids {
			sets[i] = w.args(id)
		}
		if w.rowKey != nil {
			slices.SortFunc(sets, func(a, b [][]any) int { return cmp.Compare(w.rowKey(a), w.rowKey(b)) })
		}
		for _, args := range sets {
			for i, a := range args {
				if err := exec(ctx, w.stmts[i], a...); err != nil {
					return err
				}
			}
		}
		return nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return exec(ctx, w.batch(len(ids)), args...)
}

func messageIDs(msgs []*message.Message) []string {
	ids := make([]string, len(msgs))
	for i, msg := range msgs {
		ids[i] = msg.UUID
	}
	return ids
}

// batchConsumer wraps inbox.BatchConsumer.Process as a [BatchHandler].
func batchConsumer(store inbox.BatchConfig, h inbox.BatchHandlerFunc) (BatchHandler, error) {
	store.Consumer = Consumer
	c, err := inbox.NewBatchConsumer(store, h)
	if err != nil {
		return nil, err
	}
	return c.Process, nil
}

func (c *sqlConn) BareBatch(w Write) BatchHandler {
	return func(ctx context.Context, msgs []*message.Message) error {
		tx, err := c.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := w.execBatch(ctx, messageIDs(msgs), sqlExec(tx)); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

func (c *sqlConn) InboxBatch(sc sqlinbox.Config, w Write) (BatchHandler, error) {
	sc.Dialect = c.d.dialect
	store, err := sqlinbox.New(c.db, sc)
	if err != nil {
		return nil, err
	}
	return batchConsumer(inbox.BatchConfig{Store: store}, func(ctx context.Context, msgs []*message.Message) error {
		tx, _ := inbox.TxFromContext(ctx)
		return w.execBatch(ctx, messageIDs(msgs), sqlExec(tx))
	})
}

func (c *pgxConn) BareBatch(w Write) BatchHandler {
	return func(ctx context.Context, msgs []*message.Message) error {
		tx, err := c.pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := w.execBatch(ctx, messageIDs(msgs), pgxExec(tx)); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		return tx.Commit(ctx)
	}
}

func (c *pgxConn) InboxBatch(sc sqlinbox.Config, w Write) (BatchHandler, error) {
	store, err := pgxinbox.NewStore(c.pool, sc)
	if err != nil {
		return nil, err
	}
	return batchConsumer(inbox.BatchConfig{Store: store}, func(ctx context.Context, msgs []*message.Message) error {
		tx, _ := pgxinbox.TxFromContext(ctx)
		return w.execBatch(ctx, messageIDs(msgs), pgxExec(tx))
	})
}

// RunBatch calls h from workers goroutines for d, each with batches of size
// messages from next, and measures every call. Each message's latency is
// its batch's call (the wait to fill a batch is the consumer's, not
// counted); a failed batch counts its messages as errors.
func RunBatch(ctx context.Context, h BatchHandler, workers, size int, d time.Duration, next Messages) Result {
	return runTimed(ctx, workers, size, d, func(w int) func() error {
		batch := make([]*message.Message, size)
		for i := range batch {
			batch[i] = next(w)
		}
		return func() error { return h(ctx, batch) }
	})
}
