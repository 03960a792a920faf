package sqlinbox

import (
	"context"

	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// Maintenance returns the store's maintenance seam, for package purge and
// the inbox command; its type is internal to this module and may change in
// any release.
func (s *Store) Maintenance() maintenance.Store {
	if s == nil {
		return nil
	}
	return maintainer{s}
}

// maintainer implements maintenance.Store with the store's dialect.
type maintainer struct{ s *Store }

var _ maintenance.Store = maintainer{}

func (m maintainer) Table() string     { return m.s.table.String() }
func (m maintainer) Dialect() string   { return m.s.dialect.String() }
func (m maintainer) Partitioned() bool { return m.s.config.Partitioning != NoPartitioning }

func (m maintainer) Limits() maintenance.Limits {
	if pd, ok := m.s.dialect.(purgeDialect); ok {
		return pd.purgeLimits()
	}
	return maintenance.Limits{}
}

func (m maintainer) BeginPurge(ctx context.Context) (maintenance.PurgeSession, bool, error) {
	sess, ok, err := m.s.beginPurge(ctx)
	if !ok {
		// Not sess: a nil *purgeSession in the interface is not nil.
		return nil, false, err
	}
	return sess, true, nil
}

func (m maintainer) ClaimSQL() maintenance.ClaimSQL {
	s := m.s
	var verify func(ctx context.Context) error
	if s.q.verify != nil {
		verify = func(ctx context.Context) error { return s.q.verify(ctx, s.db, s.q) }
	}
	return maintenance.ClaimSQL{
		Before:       s.q.beforeClaim,
		CheckBefore:  s.q.checkBeforeClaim,
		Insert:       s.q.claim,
		Fingerprints: s.config.Fingerprints,
		Claimed:      s.claimed,
		After:        s.q.afterClaim,
		Fingerprint:  s.q.fingerprint,
		Classify:     s.dialect.classify,
		Verify:       verify,
	}
}
