package inbox

import (
	"fmt"
	"path"
	"reflect"
	"sync"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/watermill-inbox/inbox/internal/session"
	"github.com/watermill-inbox/inbox/observe"
)

// txUseGuard warns about a handler that succeeded without taking the inbox
// transaction: whatever it wrote in SQL went around the claim, and after a
// crash its redelivery is acked as a duplicate. A consumer that took the
// transaction for an earlier message is not reported, so that a handler
// which skips events it does not care about is not taken for a miswired
// one.
type txUseGuard struct {
	guardDefaults
	report   *reporter
	store    any
	accessor string // the accessor that fits the store

	mu   sync.RWMutex // a map under a read lock: a sync.Map's any keys would allocate per message
	used map[string]bool
}

func newTxUseGuard(d guardDeps) guard {
	return &txUseGuard{report: d.report, store: d.store, accessor: accessorOf(d.store)}
}

func (g *txUseGuard) afterCommit(v *visit) {
	s, ob := v.s, v.ob
	if s.WrongAccessor() {
		ob.Warning = observe.WrongAccessor
	}
	if s.TxNotNeeded() {
		return
	}
	g.mu.RLock()
	used := g.used[s.Consumer]
	g.mu.RUnlock()
	if used {
		return
	}
	if s.TxTaken() {
		g.mu.Lock()
		if g.used == nil {
			g.used = map[string]bool{}
		}
		g.used[s.Consumer] = true
		g.mu.Unlock()
		return
	}
	g.report.warn(observe.TxUnused, s.Consumer, ob,
		"the handler succeeded without taking the inbox transaction: write through "+g.accessor+", or call inbox.TxNotNeeded",
		watermill.LogFields{"event_id": s.EventID, "message_uuid": s.Msg.UUID})
}

// WrongAccessor implements the session's reporter: the handler asked
// accessor for a transaction of a kind the store does not hand out, got
// none, and fails, panics on nil, or writes around the claim.
func (g *txUseGuard) WrongAccessor(s *session.Session, accessor string) {
	g.report.warn(observe.WrongAccessor, s.Consumer, nil,
		fmt.Sprintf("%s returned no transaction: %T hands out another kind; take it with %s", accessor, g.store, g.accessor),
		watermill.LogFields{"event_id": s.EventID, "message_uuid": s.Msg.UUID})
}

// accessorOf names the transaction accessor that fits store, by the
// convention of this module's stores: pgxinbox.TxFromContext for a
// *pgxinbox.Store, inbox.TxFromContext for those on database/sql.
func accessorOf(store any) string {
	t := reflect.TypeOf(store)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if p := path.Base(t.PkgPath()); p == "pgxinbox" {
		return p + ".TxFromContext(msg.Context())"
	}
	return "inbox.TxFromContext(msg.Context())"
}
