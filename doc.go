// Package inbox is the transactional inbox for Watermill routers: it turns
// at-least-once delivery into effectively-once processing. A message that
// arrives ten times has the effect of arriving once.
//
// For each message, in one SQL transaction, the middleware inserts the pair
// (consumer, event id) into the inbox table first, with a conflict clause
// that cannot fail, and looks at the affected rows:
//
//   - a new row: the handler runs with the transaction in its context
//     ([TxFromContext]) and writes its effects through it; success commits the
//     effects and the inbox row together, an error or a panic rolls both back
//     so the redelivery is processed again;
//   - no row: the event was already committed by this consumer; the handler
//     is not called and the message is acked.
//
// The database's unique key decides, so two workers racing on one event get
// exactly one winner, and a commit whose outcome is unknown is still safe: the
// redelivery finds the row if the commit happened.
//
// Setup, on PostgreSQL (MySQL/MariaDB and SQLite work the same way):
//
//	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
//	if err != nil { ... }
//	if err := store.CreateSchema(ctx); err != nil { ... }
//	mw, err := inbox.NewMiddleware(inbox.Config{Store: store})
//	if err != nil { ... }
//	router.AddMiddleware(middleware.Recoverer)
//	router.AddConsumerHandler("invoicing", "orders", sub, inbox.ConsumerHandler(mw, func(msg *message.Message) error {
//		tx, ok := inbox.TxFromContext(msg.Context())
//		if !ok {
//			return inbox.ErrNotInInbox // the wrong accessor for the store is logged
//		}
//		_, err := tx.ExecContext(msg.Context(), `INSERT INTO invoices ...`)
//		return err
//	}))
//
// The inbox must be the innermost middleware: a [Retry], [PoisonQueue] or
// [Duplicator] inside it runs in its transaction, and the writes of failed or
// repeated calls commit. [ConsumerHandler] and [Handler] wrap the handler
// function itself, so every other middleware wraps the inbox whatever the
// order of the calls. [message.Router.AddMiddleware] works too, added after
// every other middleware (see [NewMiddleware]). A wiring that would lose or
// double an effect fails with [ErrMiswired]; one that is only suspicious is
// logged once through [Config.Logger] and the message goes on.
//
// [IsPermanent] and [IsTransient] sort the middleware's errors for a poison
// queue and a retry: a message without a usable event id goes to the poison
// queue at once, one that met a database restarting is waited out in place
// by [NewBackoff]. A handler's own error is transient only on evidence (the
// claim's connection gone, and the database silent on another when the
// handler cancelled its own statement) or when it says so with [Transient];
// [Permanent] poisons it at once.
//
// Effects outside the database cannot join the transaction: write follow-up
// events to an outbox in the same transaction ([Config.ProducedPublisher],
// built with [PublishInTx]), or accept at-most-once with [AfterCommit].
// Metrics and traces come through [Config.Observer], whose types are in
// package [observe].
//
// The stores: package [sqlinbox] keeps the claims through [database/sql]
// (PostgreSQL, MySQL/MariaDB, SQLite) and links no database driver; package
// [pgxinbox] keeps them through pgx used natively (pgxpool), with BEGIN and
// the claim sent in one round trip, and its handlers take a pgx.Tx from
// [pgxinbox.TxFromContext]. [NewMiddleware] takes either store; package
// [purge] removes expired claims from either.
//
// [Retry]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#Retry
// [PoisonQueue]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#PoisonQueue
// [Duplicator]: https://pkg.go.dev/github.com/ThreeDotsLabs/watermill/message/router/middleware#Duplicator
// [sqlinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox
// [pgxinbox]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox
// [pgxinbox.TxFromContext]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#TxFromContext
// [purge]: https://pkg.go.dev/github.com/watermill-inbox/inbox/purge
// [observe]: https://pkg.go.dev/github.com/watermill-inbox/inbox/observe
package inbox
