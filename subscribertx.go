package inbox

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/watermill-inbox/inbox/internal/peek"
)

// A watermill-sql subscriber (v3, v4) hands each message over inside a
// transaction of its own, which its sql.TxFromContext returns; Watermill's
// exactly-once-delivery-counter example writes the handler's effects there.
// Behind the inbox those writes would commit apart from the claim: a crash
// between the claim's commit and the subscriber's leaves the claim without
// the effect, and the redelivery is skipped as a duplicate.
//
// The claim does not join the subscriber's transaction (under a savepoint):
// watermill-sql commits that transaction whenever it stops waiting for the
// ack, when AckDeadline expires or the subscriber closes, even while the
// handler is still writing in it, which would commit the claim with half an
// effect. Instead the claim's transaction stands in for the subscriber's in
// the handler's context, so both accessors return it and the subscriber's
// transaction carries only the offset, as a broker's ack would.
//
// The engine cannot import watermill-sql (v4 links pgx), so it finds the
// context key by its type: a string type named contextKey in a package
// github.com/ThreeDotsLabs/watermill-sql/.../pkg/sql, holding a transaction.
// The key's type and the wrappers' Tx field are read in package peek, whose
// tests, and those running real v3 and v4 subscribers, fail on a change
// there.

// subscriberTxLike is what a stored value must offer to be taken for a
// transaction: [*sql.Tx], and watermill-sql v4's Tx wrappers, do.
type subscriberTxLike interface {
	Commit() error
	Rollback() error
}

// maxContexts bounds the walk up a context chain: far beyond any real one,
// it stops a custom context whose parents loop.
const maxContexts = 100_000

// subscriberTx is the watermill-sql transaction a message came with, if
// any: the value stored under key in its context.
type subscriberTx struct {
	key, value any
	found      bool
}

// lookup finds the watermill-sql transaction ctx carries, if any.
func (f *txFinder) lookup(ctx context.Context) (subscriberTx, bool) {
	key, value, ok := f.find(ctx)
	return subscriberTx{key: key, value: value, found: ok}, ok
}

// standIn returns ctx with tx, the claim's transaction as the handler writes
// through it (a [*sql.Tx] or a [pgx.Tx]), in the subscriber's transaction's
// place. The error, wrapping [ErrSubscriberTx], is for a transaction tx cannot
// stand in for.
//
// [pgx.Tx]: https://pkg.go.dev/github.com/jackc/pgx/v5#Tx
func (st subscriberTx) standIn(ctx context.Context, tx any) (context.Context, error) {
	v, err := standIn(st.value, tx)
	if err != nil {
		return nil, err
	}
	return context.WithValue(ctx, st.key, v), nil
}

// txFinder finds a transaction stored in a context under a key whose type
// isKey accepts, and remembers what it found so that the walk up the
// context runs rarely:
//
//   - the keys found so far, so that a message from a watermill-sql
//     subscriber is recognised with a plain ctx.Value lookup;
//   - contexts whose chain holds no such transaction (clean), so that the
//     walk for a message from another broker stops at the first of them:
//     the subscriber's and the application's contexts every message is made
//     on. What a message adds on top (the subscriber's and the router's
//     values) is walked, a constant few; the depth of the context below it
//     costs nothing after the first message.
//
// A context never changes its parents nor its values once made, so a clean
// context stays clean.
// The zero value finds watermill-sql's transactions.
type txFinder struct {
	isKey func(reflect.Type) bool // nil: watermill-sql's keys
	known atomic.Pointer[[]any]
	mu    sync.Mutex // serialises writes to known
	clean [cleanSlots]atomic.Pointer[reflect.Value]
	plans sync.Map // reflect.Type -> *contextPlan
}

// cleanSlots is how many clean contexts a txFinder remembers, one per slot
// by the context's address: a few per subscriber, for the programs' few
// subscribers. An entry holds its context, so no other context can take
// its address while it stands.
const cleanSlots = 256

func (f *txFinder) find(ctx context.Context) (key, value any, ok bool) {
	if keys := f.known.Load(); keys != nil {
		for _, k := range *keys {
			if v, ok := txValue(ctx, k); ok {
				return k, v, true
			}
		}
	}
	keys, visited, unknown := f.walk(ctx)
	for _, k := range keys {
		if v, ok := txValue(ctx, k); ok {
			f.remember(k)
			return k, v, true
		}
	}
	if unknown {
		for _, v := range visited {
			f.clean[cleanSlot(v)].Store(&v)
		}
	}
	return nil, nil, false
}

func cleanSlot(v reflect.Value) uint64 {
	return uint64(v.Pointer()) * 0x9E3779B97F4A7C15 >> 56 // Fibonacci hashing to 0..255
}

// isClean reports whether v, a pointer to a context, was found clean.
func (f *txFinder) isClean(v reflect.Value) bool {
	e := f.clean[cleanSlot(v)].Load()
	return e != nil && e.Type() == v.Type() && e.Pointer() == v.Pointer()
}

func txValue(ctx context.Context, key any) (any, bool) {
	v := ctx.Value(key)
	if _, ok := v.(subscriberTxLike); !ok {
		return nil, false
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() {
		return nil, false
	}
	return v, true
}

func (f *txFinder) remember(k any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []any
	if old := f.known.Load(); old != nil {
		keys = append(keys, *old...)
	}
	for _, known := range keys {
		if known == k {
			return
		}
	}
	keys = append(keys, k)
	f.known.Store(&keys)
}

// walk walks ctx and its parents and returns a copy of every key whose
// type f.isKey accepts, and some of the contexts it walked through: the
// 1st, 2nd, 4th, 8th... of those that are pointers, so that a message made
// on the same contexts meets one of them within twice the length of what
// it adds. It does not go above a context found clean. unknown reports a
// walk to the top that met no clean context: only then are the contexts
// worth remembering (after the first message on them, the others meet
// them, and remembering what each message adds would only push them out).
// It is false too when the walk stopped at maxContexts, with the top
// unseen.
//
// A parent is a field whose type is a context; the standard library's
// contexts keep theirs in an embedded Context or in c, and a struct
// embedded in a context (timerCtx's cancelCtx) is searched as part of it.
// Keys are those of [context.WithValue], in a field named key. Fields are
// only read: the keys are rebuilt from their type and text, so that
// ctx.Value, not reflection, reads what is stored under them.
func (f *txFinder) walk(ctx context.Context) (keys []any, visited []reflect.Value, unknown bool) {
	stack := []reflect.Value{reflect.ValueOf(ctx)}
	pointers, metClean := 0, false
	for n := 0; len(stack) > 0 && n < maxContexts; n++ {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for v.Kind() == reflect.Interface && !v.IsNil() {
			v = v.Elem()
		}
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			if f.isClean(v) {
				metClean = true
				continue
			}
			if pointers++; pointers&(pointers-1) == 0 {
				visited = append(visited, v)
			}
			v = v.Elem()
		}
		for (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && !v.IsNil() {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			continue
		}
		p := f.planFor(v.Type())
		for _, i := range p.parents {
			stack = append(stack, v.FieldByIndex(i))
		}
		for _, i := range p.values {
			fv := v.FieldByIndex(i)
			if fv.IsNil() {
				continue
			}
			if kt := fv.Elem().Type(); f.keyType(kt) {
				k := reflect.New(kt).Elem()
				k.SetString(fv.Elem().String())
				keys = append(keys, k.Interface())
			}
		}
	}
	return keys, visited, len(stack) == 0 && !metClean
}

// contextPlan lists, for one context type, the fields that hold a parent
// and those that hold a key ([peek.ContextFields]). Plans are cached:
// reflecting on a type's fields for every message would cost more than the
// walk.
type contextPlan struct {
	parents, values [][]int
}

func (f *txFinder) planFor(t reflect.Type) *contextPlan {
	if p, ok := f.plans.Load(t); ok {
		return p.(*contextPlan)
	}
	p := &contextPlan{}
	p.parents, p.values = peek.ContextFields(t)
	f.plans.Store(t, p)
	return p
}

// standIn returns what takes value's place for the handler: tx as it is
// when it has value's type (v3's [*sql.Tx]), else a copy of value's wrapper
// with its exported Tx field replaced (v4's [*sql.StdSQLTx] around a *sql.Tx,
// [*sql.PgxTx] around a [pgx.Tx]).
//
// [*sql.StdSQLTx]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql#StdSQLTx
// [*sql.PgxTx]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql#PgxTx
// [pgx.Tx]: https://pkg.go.dev/github.com/jackc/pgx/v5#Tx
func standIn(value, tx any) (any, error) {
	txType, vt := reflect.TypeOf(tx), reflect.TypeOf(value)
	if txType.AssignableTo(vt) {
		return tx, nil
	}
	st, ptr := vt, vt.Kind() == reflect.Pointer
	if ptr {
		st = vt.Elem()
	}
	if f, ok := peek.WrapperTx(st); ok && txType.AssignableTo(f.Type) {
		w := reflect.New(st)
		w.Elem().Set(reflect.Indirect(reflect.ValueOf(value)))
		w.Elem().FieldByIndex(f.Index).Set(reflect.ValueOf(tx))
		if !ptr {
			return w.Elem().Interface(), nil
		}
		return w.Interface(), nil
	}
	return nil, fmt.Errorf("%w: a %s cannot stand in for the subscriber's %s: a sqlinbox store takes sql.BeginnerFromStdSQL, a pgxinbox store sql.BeginnerFromPgx", ErrSubscriberTx, txType, vt)
}

func (f *txFinder) keyType(t reflect.Type) bool {
	if f.isKey == nil {
		return peek.IsContextKey(t)
	}
	return f.isKey(t)
}
