// Package galera tests the inbox on a three-node MariaDB Galera cluster,
// where every node accepts writes and copies of one event race on
// different nodes: the database decides at COMMIT (certification), not at
// the claim. Its tests start their own cluster (package dbserver), kill a
// node mid-stream and restart it, and measure what the inbox costs there
// beside a single MariaDB.
package galera
