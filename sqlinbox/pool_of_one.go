package sqlinbox

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// poolOfOneWarning is how long a claim may hold the only connection of a
// pool of one (SetMaxOpenConns(1), the usual advice for SQLite) while
// another caller waits for it before the store says so. A handler that asks
// the pool for a second connection then waits for its own transaction
// forever; but the waiter may as well be a health probe beside a slow
// handler, so this only warns, once per store, and never cancels anything.
const poolOfOneWarning = 10 * time.Second

// watchPoolOfOne starts t's watch when db is a pool of one: callers that
// begin waiting for a connection after the claim (its own wait for BEGIN
// is behind it) and still wait when the watch fires can only be served
// once t ends.
func (s *Store) watchPoolOfOne(t *claimTx) {
	if s.gate.Size() != 1 {
		return
	}
	waits := s.db.Stats().WaitCount
	t.watch = time.AfterFunc(poolOfOneWarning, func() {
		if s.db.Stats().WaitCount > waits && s.poolWarned.CompareAndSwap(false, true) {
			s.config.Logger.Error("Inbox: a claim held the pool's only connection for 10 s while a caller waited; a handler asking the pool for one waits for itself", nil, watermill.LogFields{
				"table": s.table.String(), "remedy": "write through the inbox transaction, and give the pool two connections or more",
			})
		}
	})
}
