package conformancetest

import (
	"context"
	"testing"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testdb"
)

// timedIDs hands the store, for each event id that carries no time, a
// UUIDv7 made from it at a fixed time, so that the suite's readable ids
// ("order-42") run against a table partitioned by the time inside event
// ids. The middleware and the handler still see the readable id; every
// copy of an event maps to the same UUIDv7, as every copy of a real one
// carries the same id.
type timedIDs struct{ store inboxdriver.Store }

// idTimeEpoch is the time of the mapped ids: now, when the suite starts,
// so that they fall in the partition CreateSchema made for today.
var idTimeEpoch = testdb.Now()

func timed(id string) string {
	if _, ok := inbox.TimeInEventID(id); ok {
		return id
	}
	return testdb.UUIDv7(idTimeEpoch, id)
}

func (s timedIDs) Claim(ctx context.Context, c inboxdriver.Claim) (inboxdriver.Tx, []byte, error) {
	c.EventID = timed(c.EventID)
	return s.store.Claim(ctx, c)
}

// CheckEventID checks the id the store will see, and hands the middleware
// back the readable one.
func (s timedIDs) CheckEventID(id string) (string, error) {
	if c, ok := s.store.(inboxdriver.EventIDChecker); ok {
		if _, err := c.CheckEventID(timed(id)); err != nil {
			return "", err
		}
	}
	return id, nil
}

func (s timedIDs) CheckFingerprints() error {
	if c, ok := s.store.(inboxdriver.FingerprintChecker); ok {
		return c.CheckFingerprints()
	}
	return nil
}

func (s timedIDs) CountTxWrites(ctx context.Context, tx inboxdriver.Tx) (int64, bool, error) {
	if c, ok := s.store.(inboxdriver.TxWriteCounter); ok {
		return c.CountTxWrites(ctx, tx)
	}
	return 0, false, nil
}

func (s timedIDs) Heartbeat(ctx context.Context, h inboxdriver.Heartbeat) ([]string, error) {
	return s.store.(inboxdriver.ConsumerRegistry).Heartbeat(ctx, h)
}

func (s timedIDs) ProbeTx(ctx context.Context, tx inboxdriver.Tx) error {
	if p, ok := s.store.(inboxdriver.TxProber); ok {
		return p.ProbeTx(ctx, tx)
	}
	return nil
}

func (s timedIDs) IsCancelled(err error) bool {
	d, ok := s.store.(inboxdriver.DBProber)
	return ok && d.IsCancelled(err)
}

func (s timedIDs) ProbeDB(ctx context.Context) error {
	if d, ok := s.store.(inboxdriver.DBProber); ok {
		return d.ProbeDB(ctx)
	}
	return nil
}

func (s timedIDs) IsUnavailable(err error) bool {
	d, ok := s.store.(inboxdriver.UnavailableDetector)
	return ok && d.IsUnavailable(err)
}

// timed wraps store in timedIDs on an EventIDTime target.
func (b *bundle) timed(store inboxdriver.Store) inboxdriver.Store {
	if !b.target.EventIDTime {
		return store
	}
	return timedIDs{store: store}
}

// skipReadableIDs skips, on an EventIDTime target, a case that reaches the
// inbox table by the suite's readable ids, which the table never holds
// there. sqlinbox's TestEventIDTime* tests cover those behaviours with real
// UUIDv7 ids.
func skipReadableIDs(t *testing.T, target Target, why string) {
	if target.EventIDTime {
		t.Skipf("%s: %s", target.Name, why)
	}
}

// ClaimBatch maps each id as Claim does; claimed keeps the batch's order.
func (s timedIDs) ClaimBatch(ctx context.Context, b inboxdriver.BatchClaim) (inboxdriver.Tx, []bool, error) {
	mapped := make([]string, len(b.EventIDs))
	for i, id := range b.EventIDs {
		mapped[i] = timed(id)
	}
	b.EventIDs = mapped
	return s.store.(inboxdriver.BatchClaimer).ClaimBatch(ctx, b)
}
