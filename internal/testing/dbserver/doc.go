// Package dbserver starts database servers that a test owns and may kill:
// a PostgreSQL server, a MariaDB server, a three-node PostgreSQL cluster
// under Patroni with etcd and a three-node MariaDB Galera cluster, each from
// the Debian packages' binaries, in a
// temporary directory, on loopback ports nothing else listens on.
//
// The servers the rest of the suite shares (the machine's, or those test.sh
// starts) must never be killed: a test that crashes a database starts its
// own here. As root, PostgreSQL, Patroni and etcd run as the postgres user
// (PostgreSQL refuses to run as root), Galera's nodes as the mysql user. Everything a test started is killed
// and its directory removed when the test ends, passed or failed; test.sh
// kills what a test binary that died left behind (see ServersDirEnv).
package dbserver
