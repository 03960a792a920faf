package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/peek"
	"github.com/watermill-inbox/inbox/internal/session"
	"github.com/watermill-inbox/inbox/observe"
)

// PublishInTx returns the [Config.ProducedPublisher] of a store on
// database/sql: build makes, for each message, a publisher that writes
// through tx, the transaction of the message's claim (watermill-sql v4:
// sql.NewPublisher(sql.TxFromStdSQL(tx), ...); v3: sql.NewPublisher(tx,
// ...)). The messages then commit with the claim and the handler's effect.
// A store on native pgx takes pgxinbox.PublishInTx instead.
func PublishInTx(build func(tx *sql.Tx) (message.Publisher, error)) inboxdriver.TxPublisher {
	return sqlPublisher(build)
}

type sqlPublisher func(tx *sql.Tx) (message.Publisher, error)

func (b sqlPublisher) PublisherFor(tx inboxdriver.Tx) (message.Publisher, error) {
	t, ok := tx.Handle().(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("%w: inbox.PublishInTx needs a *sql.Tx, and this store hands out a %T: use pgxinbox.PublishInTx", ErrMiswired, tx.Handle())
	}
	return b(t)
}

// publisherGuard checks the produced publisher two ways. A watermill-sql
// publisher holds its database handle in a field: one holding another
// handle than the claim's transaction (the *sql.DB, a pool) is proof that
// its rows commit apart from the claim, and a redelivery after a failed
// commit publishes them again, so it is refused before it writes. Any
// other publisher is only suspected: the rows the transaction wrote are
// counted around the first publish of each consumer, and a publisher that
// wrote none (a broker's, or an outbox that deduplicates and found its rows
// there already) is warned about, not refused.
type publisherGuard struct {
	guardDefaults
	publisher inboxdriver.TxPublisher    // Config.ProducedPublisher
	counter   inboxdriver.TxWriteCounter // nil: the store cannot count
	report    *reporter

	mu      sync.Mutex
	counted map[string]bool // consumers whose first publish was counted
}

func newPublisherGuard(d guardDeps) guard {
	if d.config.ProducedPublisher == nil {
		return guardDefaults{}
	}
	counter, _ := d.store.(inboxdriver.TxWriteCounter)
	return &publisherGuard{publisher: d.config.ProducedPublisher, counter: counter, report: d.report}
}

// afterHandler publishes the handler's produced messages through the
// [Config.ProducedPublisher] built on the session's transaction, and takes
// them from the router.
func (g *publisherGuard) afterHandler(v *visit) error {
	if len(v.produced) == 0 {
		return nil
	}
	v.s.MarkTxTaken()
	if err := g.publish(v.s.Msg.Context(), v.s, v.produced, v.ob); err != nil {
		return err
	}
	v.produced = nil
	return nil
}

func (g *publisherGuard) publish(ctx context.Context, s *session.Session, produced []*message.Message, ob *observe.Observation) error {
	topic := message.PublishTopicFromCtx(ctx)
	if topic == "" {
		return fmt.Errorf("%w: the handler returned messages but has no publish topic; add it with router.AddHandler", ErrMiswired)
	}
	pub, err := g.publisher.PublisherFor(s.Tx)
	if err != nil {
		return fmt.Errorf("inbox: building the in-transaction publisher: %w", err)
	}
	if other := foreignHandle(pub, s.Tx.Handle()); other != "" {
		return fmt.Errorf("%w: the produced publisher writes through %s, not the inbox transaction; build it on the tx PublishInTx gives", ErrMiswired, other)
	}
	if skippingSchema(pub) {
		g.report.warn(observe.SkippingRelay, s.Consumer, ob,
			"the produced publisher writes with watermill-sql's DefaultMySQLSchema, whose relay skips rows committed out of order: use v4's MySQLQueueSchema (docs/outbox.md)", nil)
	}
	counter := g.counter
	if counter == nil || !g.first(s.Consumer) {
		return g.send(pub, topic, produced)
	}
	before, ok, err := counter.CountTxWrites(ctx, s.Tx)
	if err != nil || !ok || before < 1 { // the claim's own row is not counted: statistics are off
		if err != nil {
			g.report.unchecked("produced publisher", s.Consumer, err)
		}
		return g.send(pub, topic, produced)
	}
	if err := g.send(pub, topic, produced); err != nil {
		return err
	}
	after, ok, err := counter.CountTxWrites(ctx, s.Tx)
	switch {
	case err != nil:
		g.report.unchecked("produced publisher", s.Consumer, err)
	case ok && after <= before:
		g.report.warn(observe.PublisherOutsideTx, s.Consumer, ob,
			"the produced publisher wrote no row through the inbox transaction: unless its rows existed already, they commit apart from the claim",
			watermill.LogFields{"event_id": s.EventID, "messages": len(produced)})
	}
	return nil
}

func (g *publisherGuard) send(pub message.Publisher, topic string, produced []*message.Message) error {
	if err := pub.Publish(topic, produced...); err != nil {
		return fmt.Errorf("inbox: publishing produced messages in the transaction: %w", err)
	}
	return nil
}

// first reports whether consumer publishes for the first time.
func (g *publisherGuard) first(consumer string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.counted[consumer] {
		return false
	}
	if g.counted == nil {
		g.counted = map[string]bool{}
	}
	g.counted[consumer] = true
	return true
}

// foreignHandle names the database handle a watermill-sql publisher (v3,
// v4) writes through when it is not tx, "" when it is tx or pub is another
// kind of publisher. Only the publisher's db field is looked at, and what
// watermill-sql's own adapters wrap there; a publisher that embeds another
// (a wrapper adding metrics or logs) is looked through.
func foreignHandle(pub, tx any) string {
	if v, ok := watermillSQLPublisher(pub); ok {
		if db := peek.PublisherDB(v); db.IsValid() {
			return handleIn(db, reflect.ValueOf(tx), 4)
		}
	}
	return ""
}

// skippingSchema reports whether pub is a watermill-sql publisher (v3, v4)
// on DefaultMySQLSchema. That schema's relay, with its offsets adapter,
// skips a row that commits below an offset it already acked; the queue
// schema's relay reads the same rows without skipping any. v3 has no queue
// schema, so a v3 publisher can be right (its rows read by v4's queue
// relay): a warning, never a refusal.
func skippingSchema(pub any) bool {
	v, ok := watermillSQLPublisher(pub)
	if !ok {
		return false
	}
	adapter := peek.PublisherSchemaAdapter(v)
	if !adapter.IsValid() || adapter.IsNil() {
		return false
	}
	t := adapter.Elem().Type()
	return peek.IsWatermillSQL(t) && t.Name() == "DefaultMySQLSchema"
}

// watermillSQLPublisher returns the watermill-sql Publisher struct that pub
// is, or embeds (a wrapper adding metrics or logs is looked through), or
// that Watermill's forwarder wraps.
func watermillSQLPublisher(pub any) (reflect.Value, bool) {
	v := reflect.ValueOf(pub)
	for range 4 {
		for v.Kind() == reflect.Interface || v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		if peek.IsSQLPublisher(v.Type()) {
			return v, true
		}
		if wrapped, ok := peek.ForwarderWrapped(v); ok {
			v = wrapped
			continue
		}
		embedded, ok := v.Type().FieldByName("Publisher")
		if !ok || !embedded.Anonymous || embedded.Type != publisherType {
			return reflect.Value{}, false
		}
		v = v.FieldByIndex(embedded.Index)
	}
	return reflect.Value{}, false
}

var publisherType = reflect.TypeFor[message.Publisher]()

// Database handles, by package path and type name, for those whose
// packages the library does not link.
var (
	sqlTxType = reflect.TypeFor[*sql.Tx]()
	sqlHandle = map[reflect.Type]bool{reflect.TypeFor[*sql.DB](): true, reflect.TypeFor[*sql.Conn](): true}
	pgxHandle = map[[2]string]bool{
		{"github.com/jackc/pgx/v5/pgxpool", "Pool"}: true,
		{"github.com/jackc/pgx/v5/pgxpool", "Conn"}: true,
		{"github.com/jackc/pgx/v5", "Conn"}:         true,
	}
	pgxTx = map[[2]string]bool{
		{"github.com/jackc/pgx/v5/pgxpool", "Tx"}:          true,
		{"github.com/jackc/pgx/v5", "dbTx"}:                true,
		{"github.com/jackc/pgx/v5", "dbSimulatedNestedTx"}: true,
	}
)

// handleIn looks through v, depth levels of interfaces, pointers and
// watermill-sql's adapter structs, for a database handle, and names it
// unless it is tx.
func handleIn(v, tx reflect.Value, depth int) string {
	for depth > 0 && v.IsValid() {
		depth--
		switch v.Kind() {
		case reflect.Interface:
			if v.IsNil() {
				return ""
			}
			v = v.Elem()
			continue
		case reflect.Pointer:
			if v.IsNil() {
				return ""
			}
			t := v.Type()
			name := [2]string{t.Elem().PkgPath(), t.Elem().Name()}
			switch {
			case t == sqlTxType || pgxTx[name]:
				if tx.IsValid() && tx.Kind() == reflect.Pointer && v.Pointer() == tx.Pointer() {
					return ""
				}
				return "another transaction (" + t.String() + ")"
			case sqlHandle[t] || pgxHandle[name]:
				return "a " + t.String()
			case peek.AdapterHandle(v.Elem()).IsValid():
				v = peek.AdapterHandle(v.Elem())
				continue
			}
		case reflect.Struct:
			if h := peek.AdapterHandle(v); h.IsValid() { // an adapter held by value
				v = h
				continue
			}
		}
		return ""
	}
	return ""
}
