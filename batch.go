package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/errtext"
	"github.com/watermill-inbox/inbox/internal/session"
	"github.com/watermill-inbox/inbox/observe"
)

// Defaults of [BatchConfig].
const (
	DefaultMaxBatchSize = 100
	DefaultMaxBatchWait = 100 * time.Millisecond
)

// BatchHandlerFunc handles the new messages of one batch in one
// transaction: write through [TxFromContext](ctx) (pgxinbox.TxFromContext
// for native pgx), which every message's context also carries. It never sees
// a duplicate. An error or a panic rolls back every message of msgs.
type BatchHandlerFunc func(ctx context.Context, msgs []*message.Message) error

// BatchConfig configures [NewBatchConsumer].
type BatchConfig struct {
	// Store records claims; it must claim in batches
	// ([inboxdriver.BatchClaimer]): a *sqlinbox.Store or a
	// *pgxinbox.Store. Required.
	Store inboxdriver.Store

	// Consumer scopes the claims as [Config.Consumer] does: a batch
	// consumer and a middleware of the same name share one claim per
	// event. Required.
	Consumer string

	// EventID extracts the event id. Defaults to [DefaultEventID].
	EventID EventIDFunc

	// TxOptions are the batch transaction's options. Defaults to nil: the
	// database's default.
	TxOptions *sql.TxOptions

	// MaxSize is the most messages [BatchConsumer.Run] puts in a batch.
	// Defaults to [DefaultMaxBatchSize].
	MaxSize int

	// MaxWait is how long [BatchConsumer.Run] waits, after a batch's first
	// message, for more. Defaults to [DefaultMaxBatchWait].
	MaxWait time.Duration

	// Subscriptions is how many subscriptions [BatchConsumer.Run] merges,
	// as [Subscriptions] does: a batch holds at most one message per
	// subscription on Watermill's AMQP, NATS and Redis Streams
	// subscribers, so fewer than MaxSize would have every batch wait
	// MaxWait for messages they cannot deliver. Defaults to MaxSize; to 1
	// on gochannel, whose subscriptions each get every message, and on a
	// subscriber from [Subscriptions] and on a [ManyUnacked] one.
	Subscriptions int

	// PoisonPublisher takes a message that fails on its own (its event id
	// is missing or invalid, or the handler fails on it alone, not
	// transiently), with Watermill's poison metadata; the message is then
	// acked. Defaults to nil: such a message is nacked.
	PoisonPublisher message.Publisher

	// PoisonTopic is the topic of PoisonPublisher; required with it.
	PoisonTopic string

	// Observer is told about every message, as [Config.Observer]. Defaults
	// to nil.
	Observer observe.Observer

	// Backoff paces failures as [NewBackoff] does: a transient failure
	// is retried in place after a wait, a message nacked for good only
	// after one (brokers redeliver a nack at once), and each kind of
	// failure logged at most once per LogInterval.
	Backoff BackoffConfig

	// Logger receives a line per poisoned message and failed after-commit
	// hook, and Backoff's lines. Defaults to [watermill.NopLogger].
	Logger watermill.LoggerAdapter
}

// BatchConsumer processes messages in batches, each exactly once: one
// transaction per batch claims every event with one statement
// ([inboxdriver.BatchClaimer]), runs the handler on the new ones and
// commits; then every message of the batch is acked, duplicates included.
// A batch whose handler fails is split in halves, each in a transaction of
// its own, until the message that fails is alone; see docs/batch.md.
type BatchConsumer struct {
	config  BatchConfig
	e       *engine
	claimer inboxdriver.BatchClaimer
	handler BatchHandlerFunc

	transient outageLog // transient failures, retried in place
	nacked    outageLog // messages failing on their own, without PoisonPublisher
	mu        sync.Mutex
	wait      time.Duration // the last backoff of the current run of failures
}

// NewBatchConsumer returns a [BatchConsumer] running handler.
func NewBatchConsumer(config BatchConfig, handler BatchHandlerFunc) (*BatchConsumer, error) {
	if config.MaxSize == 0 {
		config.MaxSize = DefaultMaxBatchSize
	}
	if config.MaxWait == 0 {
		config.MaxWait = DefaultMaxBatchWait
	}
	mc := Config{Store: config.Store, Consumer: config.Consumer, EventID: config.EventID, TxOptions: config.TxOptions, Observer: config.Observer, Logger: config.Logger}
	mc.setDefaults()
	config.Backoff.setDefaults()
	claimer, ok := config.Store.(inboxdriver.BatchClaimer)
	var err error
	switch {
	case handler == nil:
		err = errors.New("handler is nil")
	case config.Store != nil && !ok:
		err = fmt.Errorf("Store: %T cannot claim in batches", config.Store)
	case config.Consumer == "":
		err = errors.New("Consumer is required")
	case config.MaxSize < 0 || config.MaxWait < 0 || config.Subscriptions < 0:
		err = fmt.Errorf("MaxSize (%d), MaxWait (%s) and Subscriptions (%d) must not be negative", config.MaxSize, config.MaxWait, config.Subscriptions)
	case (config.PoisonPublisher == nil) != (config.PoisonTopic == ""):
		err = errors.New("PoisonPublisher and PoisonTopic go together")
	default:
		err = errors.Join(mc.validate(), config.Backoff.validate())
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: invalid batch config: %w", err)
	}
	config.EventID, config.Logger = mc.EventID, mc.Logger
	return &BatchConsumer{
		config: config, e: newEngine(mc), claimer: claimer, handler: handler,
		transient: outageLog{logger: config.Logger, interval: config.Backoff.LogInterval},
		nacked:    outageLog{logger: config.Logger, interval: config.Backoff.LogInterval, what: "messages of a batch failed on their own and are nacked after a backoff (set PoisonPublisher to set them aside)"},
	}, nil
}

// ManyUnacked is a subscriber whose one subscription keeps many messages
// unacked at once (sources/amqpsource, sources/natssource), so that one
// subscription fills a batch: [BatchConfig.Subscriptions] then defaults to
// 1, where a hundred subscriptions would hold a hundred times as many.
type ManyUnacked interface {
	message.Subscriber
	// ManyUnacked is how many messages one subscription keeps unacked at
	// most.
	ManyUnacked() int
}

// Run subscribes to topic and processes its messages in batches of up to
// [BatchConfig.MaxSize], collected for at most [BatchConfig.MaxWait] after
// each batch's first message, until ctx ends (it returns ctx's error) or the
// subscription closes (nil). A batch ends sooner when its subscriptions
// cannot deliver more: while none has ever delivered a message before the
// previous one was acked, a batch holding one message of every subscription
// that delivers takes only what is ready at once. See docs/batch.md.
func (c *BatchConsumer) Run(ctx context.Context, sub message.Subscriber, topic string) error {
	// gochannel and a ManyUnacked subscriber deliver before the previous
	// ack from the start: a batch waits for them to fill it.
	n, streams := c.config.Subscriptions, false
	switch sub.(type) {
	case *gochannel.GoChannel, ManyUnacked:
		streams = true
	}
	if n == 0 {
		n = c.config.MaxSize
		if _, ok := sub.(subscriptions); ok || streams {
			n = 1
		}
	}
	msgs, err := subscribeTagged(ctx, sub, topic, n)
	if err != nil {
		return err
	}
	src := &source{msgs: msgs, active: make([]bool, n), streams: streams}
	for {
		batch, more := c.collect(ctx, src)
		if len(batch) > 0 && ctx.Err() == nil {
			_ = c.Process(ctx, batch)
		} else {
			for _, msg := range batch {
				msg.Nack()
			}
		}
		if !more {
			return ctx.Err()
		}
	}
}

// source is what [BatchConsumer.Run] learnt of its subscriptions.
type source struct {
	msgs    <-chan delivery
	active  []bool // the subscriptions that delivered a message in the last MaxWait
	actives int
	streams bool // a subscription delivered a message before the previous one's ack
}

// collect reads one batch; more is false once ctx ended or msgs closed.
func (c *BatchConsumer) collect(ctx context.Context, src *source) (batch []*message.Message, more bool) {
	holding := make([]bool, len(src.active))
	held := 0
	add := func(d delivery) {
		batch = append(batch, d.msg)
		if holding[d.from] {
			src.streams = true
			return
		}
		holding[d.from], held = true, held+1
		if !src.active[d.from] {
			src.active[d.from], src.actives = true, src.actives+1
		}
	}
	select {
	case <-ctx.Done():
		return nil, false
	case d, ok := <-src.msgs:
		if !ok {
			return nil, false
		}
		add(d)
	}
	timer := time.NewTimer(c.config.MaxWait)
	defer timer.Stop()
	for len(batch) < c.config.MaxSize {
		if !src.streams && held == src.actives {
			// Nothing more can come but what is ready now.
			select {
			case d, ok := <-src.msgs:
				if !ok {
					return batch, false
				}
				add(d)
				continue
			default:
				return batch, true
			}
		}
		select {
		case <-ctx.Done():
			return batch, false
		case <-timer.C:
			// Those that delivered nothing in MaxWait are no longer
			// waited for, until they deliver again.
			for i, a := range src.active {
				if a && !holding[i] {
					src.active[i], src.actives = false, src.actives-1
				}
			}
			return batch, true
		case d, ok := <-src.msgs:
			if !ok {
				return batch, false
			}
			add(d)
		}
	}
	return batch, true
}

// Process processes one batch the caller collected (a Kafka fetch turned
// into messages): it acks every message that is done (processed, a
// duplicate, or poisoned) and nacks the others, and returns nil when all
// are done, else their errors, joined. Processing the same batch again is
// safe: what committed is a duplicate.
func (c *BatchConsumer) Process(ctx context.Context, msgs []*message.Message) error {
	items := make([]*batchItem, len(msgs))
	first := make(map[string]*batchItem, len(msgs))
	var distinct []*batchItem
	for i, msg := range msgs {
		it := &batchItem{msg: msg}
		items[i] = it
		c.start(it)
		it.ob.Consumer = c.config.Consumer
		id, err := c.e.eventID(msg)
		if err != nil {
			it.ob.Outcome = idOutcome(err)
			c.failed(ctx, it, err, true)
			continue
		}
		it.id, it.ob.EventID = id, id
		if f, ok := first[id]; ok {
			it.copyOf = f
			continue
		}
		first[id] = it
		// The guards before the claim, per event, as for one message:
		// the lease warns of another service on this consumer.
		if err := c.e.beforeClaim(&visit{msg: msg, consumer: c.config.Consumer, eventID: id, ob: &it.ob}); err != nil {
			if err != errAck {
				c.failed(ctx, it, err, true)
			}
			continue
		}
		distinct = append(distinct, it)
	}
	c.run(ctx, distinct)
	c.waitOut(ctx, items)
	var errs []error
	var nacks []*message.Message
	for _, it := range items {
		if f := it.copyOf; f != nil {
			// A second copy in one batch shares its first's fate; once
			// that committed, it is a duplicate.
			it.err, it.ob.Outcome = f.err, f.ob.Outcome
			if f.ob.Outcome == observe.Processed {
				it.ob.Outcome = observe.Duplicate
			}
		}
		it.ob.Err = it.err
		it.ob.Duration = time.Since(it.ob.Start)
		c.e.observed(it.dones, it.ob)
		if it.orig != nil {
			it.msg.SetContext(it.orig)
		}
		if it.err != nil {
			errs = append(errs, it.err)
			nacks = append(nacks, it.msg)
		} else {
			it.msg.Ack()
		}
	}
	if len(nacks) > 0 && ctx.Err() == nil {
		// The broker would hand them back at once: a hot loop.
		c.backoff(ctx)
	}
	for _, msg := range nacks {
		msg.Nack()
	}
	return errors.Join(errs...)
}

// waitOut paces the failures of items as [NewBackoff] does, logging them:
// it runs the events that failed transiently again after a backoff, until
// none does or ctx ends. [BatchConsumer.Process] then acks the others and
// waits the next backoff before it nacks what failed.
func (c *BatchConsumer) waitOut(ctx context.Context, items []*batchItem) {
	for retry := items; ; {
		var transient []*batchItem
		for _, it := range retry {
			if it.err != nil && it.copyOf == nil && IsTransient(it.err) {
				transient = append(transient, it)
			}
		}
		if len(transient) == 0 {
			c.transient.over()
			break
		}
		c.transient.failed(transient[0].err)
		if !c.backoff(ctx) {
			break
		}
		for _, it := range transient {
			it.err, it.ob.Outcome = nil, ""
		}
		c.run(ctx, transient)
		retry = transient
	}
	failed, logged := false, false
	for _, it := range items {
		if it.err == nil || it.copyOf != nil {
			continue
		}
		if !logged && !IsTransient(it.err) {
			c.nacked.failed(fmt.Errorf("event %s, message %s: %w", errtext.Quote(it.id), it.msg.UUID, it.err))
			logged = true
		}
		failed = true
	}
	if !failed {
		c.nacked.over()
		c.mu.Lock()
		c.wait = 0
		c.mu.Unlock()
	}
}

// backoff waits the next backoff of the consumer's run of failures; false
// when ctx ended first. A batch that fails nothing ends the run.
func (c *BatchConsumer) backoff(ctx context.Context) bool {
	c.mu.Lock()
	wait := c.config.Backoff.InitialInterval
	if c.wait > 0 {
		wait = min(2*c.wait, c.config.Backoff.MaxInterval)
	}
	c.wait = wait
	c.mu.Unlock()
	timer := time.NewTimer(jitter(wait))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// batchItem is one message of a batch and what became of it.
type batchItem struct {
	msg    *message.Message
	id     string
	copyOf *batchItem // an earlier message of the batch with the same id
	ob     observe.Observation
	dones  []func(observe.Observation)
	orig   context.Context // the message's context before the observers
	err    error           // nil once acked
	sess   *session.Session
}

// start tells the observers that the message entered the consumer.
func (c *BatchConsumer) start(it *batchItem) {
	if len(c.e.observers) == 0 {
		return
	}
	it.ob.Start = time.Now()
	ctx := it.msg.Context()
	it.orig = ctx
	for _, o := range c.e.observers {
		var done func(observe.Observation)
		ctx, done = c.e.startObserver(o, ctx, ctx)
		it.dones = append(it.dones, done)
	}
	it.msg.SetContext(ctx)
}

// run claims items, distinct events, in one transaction and handles the
// new ones; a failure that is not transient splits them in halves, each
// run again, down to the message that fails alone.
func (c *BatchConsumer) run(ctx context.Context, items []*batchItem) {
	if len(items) == 0 {
		return
	}
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	start := time.Now()
	tx, claimed, err := c.claimer.ClaimBatch(ctx, inboxdriver.BatchClaim{TxOptions: c.config.TxOptions, Consumer: c.config.Consumer, EventIDs: ids})
	for _, it := range items {
		it.ob.ClaimStart, it.ob.ClaimDuration = start, time.Since(start)
	}
	if err != nil && len(items) > 1 && errors.Is(err, inboxdriver.ErrBatchTooLarge) {
		half := len(items) / 2
		c.run(ctx, items[:half])
		c.run(ctx, items[half:])
		return
	}
	if err != nil {
		outcome := observe.ClaimFailed
		if errors.Is(err, ErrInFlight) {
			outcome = observe.InFlight
		}
		if !IsPermanent(err) {
			err = Transient(err)
		}
		err = fmt.Errorf("inbox: claiming a batch of %d events for consumer %q: %w", len(items), c.config.Consumer, err)
		c.fail(ctx, items, outcome, err)
		return
	}
	var fresh []*batchItem
	for i, it := range items {
		if claimed[i] {
			fresh = append(fresh, it)
		} else {
			it.ob.Outcome = observe.Duplicate
		}
	}
	if tx == nil {
		return
	}
	var ob observe.Observation
	if err := c.handle(ctx, tx, fresh, &ob); err != nil {
		c.fail(ctx, fresh, ob.Outcome, err)
	}
}

// fail ends items with err, splitting them when one of them may be the
// cause: a single item's non-transient failure is its own.
func (c *BatchConsumer) fail(ctx context.Context, items []*batchItem, outcome observe.Outcome, err error) {
	if len(items) > 1 && !IsTransient(err) {
		half := len(items) / 2
		c.run(ctx, items[:half])
		c.run(ctx, items[half:])
		return
	}
	for _, it := range items {
		it.ob.Outcome = outcome
		c.failed(ctx, it, err, len(items) == 1 && !IsTransient(err))
	}
}

// failed ends a message with err: poisoned (and acked) when it failed on
// its own and a poison publisher is set, else nacked.
func (c *BatchConsumer) failed(ctx context.Context, it *batchItem, err error, alone bool) {
	it.err = err
	if !alone || c.config.PoisonPublisher == nil {
		return
	}
	msg := it.msg.Copy()
	msg.Metadata.Set(middleware.ReasonForPoisonedKey, err.Error())
	msg.Metadata.Set(middleware.PoisonedHandlerKey, c.config.Consumer)
	msg.SetContext(context.WithoutCancel(ctx))
	if perr := c.config.PoisonPublisher.Publish(c.config.PoisonTopic, msg); perr != nil {
		it.err = errors.Join(err, fmt.Errorf("inbox: publishing to the poison topic: %w", perr))
		return
	}
	c.config.Logger.Error("Inbox: message of a batch poisoned", err, watermill.LogFields{"consumer": c.config.Consumer, "event_id": it.id, "message_uuid": it.msg.UUID})
	it.err, it.ob.Outcome = nil, observe.Poisoned
}

// handle runs the handler on fresh in tx and commits; on error tx is
// rolled back and ob.Outcome says why.
func (c *BatchConsumer) handle(ctx context.Context, tx inboxdriver.Tx, fresh []*batchItem, ob *observe.Observation) (err error) {
	committed := false
	msgs := make([]*message.Message, len(fresh))
	for i, it := range fresh {
		it.sess = &session.Session{Tx: tx, Consumer: c.config.Consumer, EventID: it.id, Msg: it.msg, Reporter: c.e.accessors}
		orig := it.msg.Context()
		it.msg.SetContext(session.With(orig, it.sess))
		defer it.msg.SetContext(orig)
		msgs[i] = it.msg
	}
	batch := &session.Session{Tx: tx, Consumer: c.config.Consumer, Msg: fresh[0].msg, Reporter: c.e.accessors}
	defer func() {
		if !committed {
			batch.End()
			for _, it := range fresh {
				it.sess.End()
			}
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	ob.Outcome = observe.RolledBack
	if err := c.call(session.With(ctx, batch), msgs); err != nil {
		return c.e.failed(ctx, tx, err, "the batch handler", ob)
	}
	if err := tx.Commit(ctx); err != nil {
		return c.e.failed(ctx, tx, fmt.Errorf("inbox: committing a batch of %d events for consumer %q (redeliveries will tell whether it was committed): %w", len(fresh), c.config.Consumer, err), "", ob)
	}
	committed = true
	hookErr := runHooks(ctx, batch, c.e.config.Logger)
	for _, it := range fresh {
		it.ob.Outcome = observe.Processed
		it.ob.AfterCommitErr = errors.Join(hookErr, runHooks(ctx, it.sess, c.e.config.Logger))
	}
	return nil
}

// call runs the handler, turning a panic into an error: the batch is then
// split like for any other failure, and the message that panics alone is
// poisoned or nacked.
func (c *BatchConsumer) call(ctx context.Context, msgs []*message.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inbox: batch handler panicked: %v", r)
		}
	}()
	return c.handler(ctx, msgs)
}
