// Package vitess tests the inbox on MySQL sharded by Vitess: a vttestserver
// of the test binary's own ([dbserver.StartVitess]) with a two-shard keyspace
// on the installed MariaDB, reached through vtgate. Its tests shard each
// table with ALTER VSCHEMA as docs/databases.md describes, and check every
// statement the library sends there: the schema, the claim (with the
// effect on the claim's shard, and on another), the purge, and inbox stats
// and check.
//
// [dbserver.StartVitess]: https://pkg.go.dev/github.com/watermill-inbox/inbox/internal/testing/dbserver#StartVitess
package vitess
