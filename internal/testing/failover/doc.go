// Package failover tests the guarantee when the database itself fails: a
// PostgreSQL primary killed under Patroni and a replica promoted (with
// synchronous and with asynchronous replication), a PostgreSQL or MariaDB
// server killed and restarted under a running stream, a consumer on SQLite
// killed mid-stream, and what the routers do while their database is down.
// Every test starts the servers it kills (package dbserver): the suite's
// shared servers are never touched.
package failover
