// Package migrations applies what the inbox command prints for migration
// tools (inbox schema, -format goose, -down) with the tools themselves,
// goose and golang-migrate, on every table layout: PostgreSQL plain and
// partitioned daily or monthly by processed_at or by event time, MariaDB
// and SQLite. Each migration goes up, is checked by inbox check and by a
// claim, goes down, and up again. The package has no code of its own.
package migrations
