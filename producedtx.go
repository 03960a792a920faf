package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The publisher [Config.ProducedPublisher] builds must write through the
// inbox transaction. One bound to the [*sql.DB] (or a pgx pool, or another
// transaction) commits its rows on its own: with a COMMIT that then fails,
// the redelivery publishes them again (a watermill-sql v4 publisher on the
// pool wrote 6 outbox rows for 3 produced messages). The middleware checks
// it two ways, neither costing a round trip on the normal path:
//
//   - before [message.Publisher.Publish], by looking inside the publisher
//     for the database handle it holds (watermill-sql v3 and v4 keep theirs
//     in a field): one holding a handle that is not the inbox transaction
//     is refused before it writes anything;
//   - when the publisher holds no handle it can see (one reached through a
//     closure, a broker's publisher), by counting the rows the transaction
//     wrote around the first Publish of each consumer, through the store
//     ([TxWriteCounter]): a publisher that wrote none is refused from then
//     on for that consumer. The messages of that first call were written
//     elsewhere already; they stay where they went.

// TxWriteCounter is implemented by stores that can tell how many rows a
// claim's transaction has written so far ([sqlinbox.Store] and
// [pgxinbox.Store]): PostgreSQL's statistics of the current transaction,
// MySQL's and MariaDB's information_schema.innodb_trx (which needs the
// PROCESS privilege), SQLite's change count of the connection. The
// middleware calls it around the first in-transaction publish of each
// consumer, to check that [Config.ProducedPublisher] writes through the
// transaction.
//
// CountTxWrites returns the count (any monotonic count of the rows tx
// wrote), and ok false when the database cannot tell: the middleware then
// cannot check, and does not.
//
// [sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
type TxWriteCounter interface {
	CountTxWrites(ctx context.Context, tx StoreTx) (n int64, ok bool, err error)
}

// publisherCheck is how far a consumer's produced publisher has been
// checked by counting writes.
type publisherCheck int

const (
	publisherUnchecked       publisherCheck = iota
	publisherWritesInTx                     // counted: it wrote through the transaction
	publisherUncheckable                    // the store cannot count
	publisherWritesElsewhere                // counted: it wrote nothing through the transaction
)

// publishInTx publishes the handler's produced messages through the
// publisher [Config.ProducedPublisher] builds in ctx, the handler's context,
// whose transaction it takes; a publisher that does not write through that
// transaction is refused with [ErrMiswired].
func (e *engine) publishInTx(ctx context.Context, s *session, produced []*message.Message) error {
	topic := message.PublishTopicFromCtx(ctx)
	if topic == "" {
		return fmt.Errorf("inbox: handler returned messages but has no publish topic; add the handler with router.AddHandler, not AddConsumerHandler")
	}
	pub, err := e.config.ProducedPublisher(ctx)
	if err != nil {
		return fmt.Errorf("inbox: building the in-transaction publisher: %w", err)
	}
	held, other := handleIn(pub, native(s.tx))
	if !held && other != "" {
		return fmt.Errorf("%w: inbox.Config.ProducedPublisher built a publisher that holds %s and not the inbox transaction: its messages would commit apart from the claim, and a redelivery after a failed commit would publish them again. %s", ErrMiswired, other, bindIt)
	}
	counter, count := e.config.Store.(TxWriteCounter)
	check := publisherUncheckable
	if !held && count {
		check = e.publisherCheck(s.consumer)
	}
	if check == publisherWritesElsewhere {
		return fmt.Errorf("%w: inbox.Config.ProducedPublisher wrote nothing through the inbox transaction when it first published for consumer %q, so its messages commit apart from the claim; refused until the process restarts. %s", ErrMiswired, s.consumer, bindIt)
	}
	var before int64
	if check == publisherUnchecked {
		var ok bool
		before, ok, err = counter.CountTxWrites(ctx, s.tx)
		switch {
		case err != nil:
			e.setPublisherCheck(s.consumer, publisherUncheckable)
			return fmt.Errorf("inbox: counting the inbox transaction's writes to check inbox.Config.ProducedPublisher: %w", err)
		case !ok || before < 1: // the claim's own row is not counted: statistics are off
			e.setPublisherCheck(s.consumer, publisherUncheckable)
			check = publisherUncheckable
		}
	}
	if err := pub.Publish(topic, produced...); err != nil {
		return fmt.Errorf("inbox: publishing produced messages in the transaction: %w", err)
	}
	if check != publisherUnchecked {
		return nil
	}
	after, ok, err := counter.CountTxWrites(ctx, s.tx)
	if err != nil || !ok {
		e.setPublisherCheck(s.consumer, publisherUncheckable)
		if err != nil {
			return fmt.Errorf("inbox: counting the inbox transaction's writes to check inbox.Config.ProducedPublisher: %w", err)
		}
		return nil
	}
	if after > before {
		e.setPublisherCheck(s.consumer, publisherWritesInTx)
		return nil
	}
	e.setPublisherCheck(s.consumer, publisherWritesElsewhere)
	return fmt.Errorf("%w: inbox.Config.ProducedPublisher published %d messages for consumer %q without writing through the inbox transaction: they went elsewhere already (an outbox through the *sql.DB, a broker) and stay there, and they would commit apart from the claim; the middleware refuses it from now on. %s", ErrMiswired, len(produced), s.consumer, bindIt)
}

// bindIt says how to build the produced publisher.
const bindIt = "Build it on the transaction of the ctx it is given: tx, ok := inbox.TxFromContext(ctx) (return inbox.ErrNotInInbox unless ok), then watermill-sql v4's sql.NewPublisher(sql.TxFromStdSQL(tx), ...) (v3: sql.NewPublisher(tx, ...)); on a pgxinbox.Store, pgxinbox.TxFromContext(ctx) and sql.TxFromPgx(tx)"

func (e *engine) publisherCheck(consumer string) publisherCheck {
	e.publisherMu.RLock()
	defer e.publisherMu.RUnlock()
	return e.publishers[consumer]
}

func (e *engine) setPublisherCheck(consumer string, c publisherCheck) {
	e.publisherMu.Lock()
	defer e.publisherMu.Unlock()
	if e.publishers == nil {
		e.publishers = map[string]publisherCheck{}
	}
	if e.publishers[consumer] != publisherWritesElsewhere {
		e.publishers[consumer] = c
	}
}

// Database handles a publisher may hold, by package path and type name,
// for those whose packages the library does not link.
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

// maxInspected bounds the values handleIn looks at in one publisher.
const maxInspected = 256

// handleIn looks through pub's fields, pointers and interfaces (not its
// maps, slices, channels or closures) for database handles. held reports
// that one of them is tx; other names one that is not (a [*sql.DB], another
// transaction), "" when none was found.
func handleIn(pub any, tx any) (held bool, other string) {
	txPtr := uintptr(0)
	if v := reflect.ValueOf(tx); v.Kind() == reflect.Pointer {
		txPtr = v.Pointer()
	}
	seen := map[uintptr]bool{}
	budget := maxInspected
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		if held || budget <= 0 || !v.IsValid() {
			return
		}
		budget--
		switch v.Kind() {
		case reflect.Interface:
			walk(v.Elem())
		case reflect.Pointer:
			if v.IsNil() || seen[v.Pointer()] {
				return
			}
			seen[v.Pointer()] = true
			t := v.Type()
			name := [2]string{t.Elem().PkgPath(), t.Elem().Name()}
			switch {
			case t == sqlTxType || pgxTx[name]:
				if v.Pointer() == txPtr {
					held = true
				} else if other == "" {
					other = "another transaction (" + t.String() + ")"
				}
				return
			case sqlHandle[t] || pgxHandle[name]:
				if other == "" {
					other = "a " + t.String()
				}
				return
			}
			walk(v.Elem())
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		}
	}
	walk(reflect.ValueOf(pub))
	return held, other
}
