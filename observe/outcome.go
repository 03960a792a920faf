package observe

// Outcome is what happened to one message in the middleware. Every message
// ends in exactly one.
type Outcome string

const (
	// Processed: the handler ran and its transaction committed.
	Processed Outcome = "processed"
	// Duplicate: the event was already committed; the handler was not
	// called and the message is acked.
	Duplicate Outcome = "duplicate"
	// MissingID and InvalidID: the message was refused before any SQL
	// (inbox.ErrMissingEventID, inbox.ErrInvalidEventID,
	// inbox.ErrNoConsumer).
	MissingID Outcome = "missing_id"
	InvalidID Outcome = "invalid_id"
	// InFlight: another copy of the event held its claim longer than the
	// store's claim timeout, or won a race the database reported as a
	// conflict (inbox.ErrInFlight); the message is retried.
	InFlight Outcome = "in_flight"
	// ClaimFailed: the claim could not be made (database down, table
	// missing); nothing ran.
	ClaimFailed Outcome = "claim_failed"
	// Miswired: processing the message would lose or double an effect
	// because of how the middleware is wired, so it was refused
	// (inbox.ErrMiswired, inbox.ErrSubscriberTx) or rolled back (a
	// PoisonQueue inside the inbox took it). The wiring needs fixing.
	Miswired Outcome = "miswired"
	// RolledBack: the handler returned an error, panicked, or the
	// in-transaction publish failed; its writes and the claim rolled back.
	RolledBack Outcome = "rolled_back"
	// Poisoned: the message failed on its own and went to the poison
	// topic; its writes and claim rolled back, and it is acked.
	Poisoned Outcome = "poisoned"
	// CommitFailed: COMMIT returned an error; the redelivery finds out
	// whether it happened.
	CommitFailed Outcome = "commit_failed"
	// IDReused: the event id was already processed with another
	// fingerprint; the handler was not called.
	IDReused Outcome = "id_reused"
	// Stale: the event was older than inbox.Config.MaxEventAge and the
	// policy rejected or skipped it, before any SQL.
	Stale Outcome = "stale"
)

// Warning is a suspicion about a consumer's wiring. The middleware never
// refuses a message on suspicion: it logs the first of each kind once per
// consumer, sets [Observation.Warning], records it for the inbox check
// command, and goes on processing.
type Warning string

const (
	// TxUnused: the handler succeeded without taking the inbox
	// transaction, so its SQL writes, if any, went around the claim.
	TxUnused Warning = "tx_unused"
	// WrongAccessor: the handler asked for the transaction through the
	// accessor of another kind of store, and got none.
	WrongAccessor Warning = "wrong_accessor"
	// PublisherOutsideTx: the produced publisher wrote nothing through
	// the inbox transaction when it published (a broker's publisher, or
	// one on the database handle), or published only what already
	// existed (an outbox that deduplicates).
	PublisherOutsideTx Warning = "publisher_outside_tx"
	// SharedConsumer: another service claims for the same consumer on
	// the same table at the same time, so each event runs in only one of
	// them. Set on every message while it lasts.
	SharedConsumer Warning = "shared_consumer"
	// SkippingRelay: the produced publisher writes with watermill-sql's
	// DefaultMySQLSchema, whose relay skips rows that commit out of order.
	SkippingRelay Warning = "skipping_relay"
	// Unchecked: a check could not run (a table it cannot read, a
	// permission, a pooler between its statements); the consumer goes
	// unchecked for that check.
	Unchecked Warning = "unchecked"
)
