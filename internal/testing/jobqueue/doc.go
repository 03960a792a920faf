// Package jobqueue holds the end-to-end tests of side effects done through a
// real job queue: the invoicing handler writes the invoice and inserts a River
// job ("send invoice email") in the inbox transaction, and a River worker
// sends the email to an SMTP server run by the test (emersion/go-smtp).
//
// The tests run both stores: pgxinbox with River's riverpgxv5 driver on the
// inbox's pgx.Tx, and sqlinbox with riverdatabasesql on its *sql.Tx, each
// with River's migrations in a schema of its own. Orders arrive twice through
// an in-process Kafka-protocol broker (kfake), and the service's processes are
// killed with SIGKILL between the commit and the send and between the SMTP
// server's acceptance and the job's completion. The tests then count from the
// database and the mailbox: exactly one invoice and one job per order, every
// email accepted at least once, and every duplicate email explained by a kill
// after its acceptance, carrying the same Message-ID (derived from the event
// id) for the receiver to drop. The package has no code of its own.
package jobqueue
