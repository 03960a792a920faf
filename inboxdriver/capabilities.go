package inboxdriver

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The interfaces below are optional: the middleware looks for each on the
// [Store] and does without what a store lacks.

// EventIDChecker is implemented by stores whose event id column accepts
// less than any valid string, such as a native UUID column. The middleware
// calls it before opening a transaction; the error wraps
// [ErrInvalidEventID]. It may return a canonical form of the id, so that
// equal ids spelled differently (upper- and lower-case UUIDs) share one row.
type EventIDChecker interface {
	CheckEventID(id string) (string, error)
}

// FingerprintChecker is implemented by stores that can keep a fingerprint
// with each claim. The middleware refuses to start with a fingerprint
// function when the store lacks it or CheckFingerprints fails (a table
// configured without the column).
type FingerprintChecker interface {
	CheckFingerprints() error
}

// ShardKeyChecker is implemented by stores that can keep a shard key with
// each claim. The middleware refuses to start when keyed (a shard key
// function is configured) does not match what CheckShardKeys accepts, and
// with a shard key function on a store that lacks this interface.
type ShardKeyChecker interface {
	CheckShardKeys(keyed bool) error
}

// TxProber is implemented by stores that can tell whether a claim's
// connection still answers. After a handler's error that carries no code of
// the database's, the middleware reports the error as transient only when
// ProbeTx returns an error: the connection did not answer a trivial
// statement. An answer, even an error of the database's own (a transaction
// aborted by the failed statement), is nil.
type TxProber interface {
	ProbeTx(ctx context.Context, tx Tx) error
}

// DBProber is implemented by stores that can tell a statement the handler
// cancelled from an outage. Drivers discard a connection whose statement a
// context cancelled, so [TxProber] finds the claim's connection gone after
// a handler's own timeout. When the handler's error is such a cancellation
// (a context's error, or one IsCancelled reports), the middleware reports
// it as transient only when ProbeDB fails too.
type DBProber interface {
	// IsCancelled reports whether err is the database's code for a
	// statement cancelled at its client's request or by a timeout its
	// session set.
	IsCancelled(err error) bool
	// ProbeDB runs a trivial statement on a connection of the store's
	// pool other than a claim's: nil when the database answered, as for
	// [TxProber.ProbeTx].
	ProbeDB(ctx context.Context) error
}

// ConflictDetector is implemented by stores whose database can report the
// race between two copies of one event as a conflict on a statement after
// the claim, or at COMMIT: a multi-primary cluster's certification failure,
// a deadlock, a serialization failure. The middleware then wraps the error
// with [ErrInFlight] instead of reporting a failed handler.
type ConflictDetector interface {
	IsConflict(err error) bool
}

// UnavailableDetector is implemented by stores that recognise their
// database's ways of saying it or the connection went away (shutting down,
// starting up, a connection killed), which the middleware reports as
// transient beside the drivers' generic errors.
type UnavailableDetector interface {
	IsUnavailable(err error) bool
}

// TxWriteCounter is implemented by stores that can tell how many rows a
// claim's transaction has written so far. The middleware counts around the
// first in-transaction publish of each consumer, and warns when the
// publisher wrote nothing through the transaction. ok is false when the
// database cannot tell.
type TxWriteCounter interface {
	CountTxWrites(ctx context.Context, tx Tx) (n int64, ok bool, err error)
}

// ConsumerRegistry is implemented by stores that keep, beside the inbox
// table, which services claim for each consumer: a lease per process,
// renewed while it claims. The middleware warns when two services claim
// for one consumer at the same time; it never refuses a message for it.
type ConsumerRegistry interface {
	// Heartbeat records that h.Instance of h.Service claims for
	// h.Consumer now, with its warnings, and returns the other services
	// whose instances claimed for it within h.Lease.
	Heartbeat(ctx context.Context, h Heartbeat) (others []string, err error)
}

// ErrNoLease is wrapped by a [ConsumerRegistry.Heartbeat] error that only a
// migration or a grant mends (the lease table missing, or the role not
// allowed to write it), so that the middleware tries again rarely rather
// than at every renewal.
var ErrNoLease = errors.New("no lease table the role may write")

// ErrGaveWay is wrapped by a [ConsumerRegistry.Heartbeat] error when the
// heartbeat let a claim have the connection it held (on a pool of one):
// nothing failed, and the middleware tries again later, saying nothing.
var ErrGaveWay = errors.New("the heartbeat gave its connection to a claim")

// LeaseTTL is how long the middleware's lease on a consumer lives after its
// last renewal: a process that stopped claiming is forgotten after it.
const LeaseTTL = time.Minute

// LeaseRenewal is how often the middleware renews a lease while its
// process claims: a lease renewed within it (and a little more) belongs to
// a process claiming now, and one renewed at least once after its first
// renewal to a process that lasts, not a short test run.
const LeaseRenewal = 20 * time.Second

// Heartbeat is one renewal of a process's lease on a consumer.
type Heartbeat struct {
	Consumer, Service, Instance string
	// Warnings are what the process suspects of the consumer's wiring,
	// comma-separated, "" for none.
	Warnings string
	// Lease is how long the renewal counts the instance as claiming.
	Lease time.Duration
	// First marks the process's first heartbeat for the consumer: the
	// store may then remove the consumer's leases that expired long ago.
	First bool
	// Timeout bounds the statements once the store has its connection;
	// the wait for one is the context's. Zero: the store's own bound.
	Timeout time.Duration
}

// TxPublisher builds, for one message, the publisher of the messages its
// handler returns, on the transaction of its claim.
type TxPublisher interface {
	PublisherFor(tx Tx) (message.Publisher, error)
}
