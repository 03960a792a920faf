package sqlinbox

import (
	"fmt"
)

// registrySuffix names the consumer registry beside the inbox table:
// "watermill_inbox_consumers".
const registrySuffix = "consumers"

// registryQueries is the SQL of an inbox table's consumer registry: one row
// per consumer, naming the service that claimed with it first
// ([inbox.ConsumerRegistry]). It is read once per consumer and process, never
// per message, so it is a plain table on every dialect and layout.
type registryQueries struct {
	// create makes the table; [Store.CreateSchema] and [Store.SchemaSQL]
	// end with it.
	create string
	// register inserts (consumer, service) unless the consumer has a row,
	// never failing on the key; owner then reads the consumer's service.
	register, owner string
	// drop removes the table, for a migration tool's down step.
	drop string
}

func (postgresql) registry(t tableName) registryQueries {
	table := t.derived(registrySuffix).quoted('"')
	return registryQueries{
		create: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer      text        NOT NULL PRIMARY KEY CHECK (octet_length(consumer) BETWEEN 1 AND 255),
	service       text        NOT NULL CHECK (octet_length(service) BETWEEN 1 AND 255),
	registered_at timestamptz NOT NULL DEFAULT now()
)`, table),
		register: fmt.Sprintf(`INSERT INTO %s (consumer, service) VALUES ($1, $2) ON CONFLICT DO NOTHING`, table),
		owner:    fmt.Sprintf(`SELECT service FROM %s WHERE consumer = $1`, table),
		drop:     `DROP TABLE IF EXISTS ` + table,
	}
}

func (mysqlDialect) registry(t tableName) registryQueries {
	table := t.derived(registrySuffix).quoted('`')
	return registryQueries{
		// Binary columns, as the inbox's: consumers compare byte for byte.
		create: fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (\n"+
			"\tconsumer      VARBINARY(255) NOT NULL PRIMARY KEY,\n"+
			"\tservice       VARBINARY(255) NOT NULL,\n"+
			"\tregistered_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6))\n"+
			") ENGINE=InnoDB", table),
		register: fmt.Sprintf("INSERT INTO %s (consumer, service) VALUES (?, ?) ON DUPLICATE KEY UPDATE consumer = consumer", table),
		owner:    fmt.Sprintf("SELECT service FROM %s WHERE consumer = ?", table),
		drop:     "DROP TABLE IF EXISTS " + table,
	}
}

func (sqlite) registry(t tableName) registryQueries {
	table := t.derived(registrySuffix).quoted('"')
	return registryQueries{
		create: fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
	consumer      TEXT NOT NULL PRIMARY KEY CHECK (length(CAST(consumer AS BLOB)) BETWEEN 1 AND 255),
	service       TEXT NOT NULL CHECK (length(CAST(service AS BLOB)) BETWEEN 1 AND 255),
	registered_at TEXT NOT NULL DEFAULT (strftime('%%Y-%%m-%%dT%%H:%%M:%%fZ', 'now'))
) WITHOUT ROWID`, table),
		register: fmt.Sprintf(`INSERT INTO %s (consumer, service) VALUES (?, ?) ON CONFLICT DO NOTHING`, table),
		owner:    fmt.Sprintf(`SELECT service FROM %s WHERE consumer = ?`, table),
		drop:     `DROP TABLE IF EXISTS ` + table,
	}
}
