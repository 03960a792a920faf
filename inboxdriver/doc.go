// Package inboxdriver is the seam between the inbox middleware
// ([inbox.NewMiddleware]) and the stores that keep its claims
// ([sqlinbox.Store] on database/sql, [pgxinbox.Store] on native pgx).
//
// API is not stable. DO NOT IMPLEMENT these interfaces outside this module:
// they change whenever the middleware needs something new from its stores.
// Applications never name this package; they pass a store from sqlinbox or
// pgxinbox to [inbox.Config].
//
// [inbox.NewMiddleware]: https://pkg.go.dev/github.com/watermill-inbox/inbox#NewMiddleware
// [inbox.Config]: https://pkg.go.dev/github.com/watermill-inbox/inbox#Config
// [sqlinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/sqlinbox#Store
// [pgxinbox.Store]: https://pkg.go.dev/github.com/watermill-inbox/inbox/pgxinbox#Store
package inboxdriver
