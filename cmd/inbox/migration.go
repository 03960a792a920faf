package main

import (
	"strings"

	"github.com/watermill-inbox/inbox/sqlinbox"
)

// migrationStatements returns the statements inbox schema prints, without their
// semicolons, and the one that undoes them: the table's, or with
// addColumn the fingerprint column's.
func migrationStatements(store *sqlinbox.Store, addColumn bool) (up []string, down string) {
	dropTable, dropColumn := store.Maintenance().DownSQL()
	if addColumn {
		return []string{strings.TrimSuffix(store.AddFingerprintColumnSQL(), ";\n")}, dropColumn
	}
	return store.SchemaStatements(), dropTable
}

// dropWarning precedes a down migration that drops the table.
const dropWarning = "-- Dropping the inbox table forgets every claim: a copy of an event processed before it is processed again.\n"

// migrationScript renders the statements for a migration tool: plain, a
// script of statements ending with semicolons (psql, golang-migrate,
// Atlas, which all read a dollar-quoted DO block as one statement), the
// down statement alone with down; or goose, one file with both sections,
// where goose is told where a statement with semicolons of its own ends,
// since it splits the rest at semicolons that end a line.
func migrationScript(format string, up []string, down string, onlyDown bool) (string, error) {
	warn := ""
	if strings.HasPrefix(down, "DROP TABLE") {
		warn = dropWarning
	}
	switch format {
	case "plain":
		if onlyDown {
			return warn + down + ";\n", nil
		}
		return strings.Join(up, ";\n\n") + ";\n", nil
	case "goose":
		if onlyDown {
			return "", usage("-down: -format goose prints the Down section in the same file as the Up one")
		}
		var b strings.Builder
		b.WriteString("-- +goose Up\n")
		for i, stmt := range up {
			if i > 0 {
				b.WriteString("\n")
			}
			if strings.Contains(stmt, ";") {
				b.WriteString("-- +goose StatementBegin\n" + stmt + ";\n-- +goose StatementEnd\n")
			} else {
				b.WriteString(stmt + ";\n")
			}
		}
		b.WriteString("\n-- +goose Down\n" + warn + down + ";\n")
		return b.String(), nil
	}
	return "", usage("-format %q: use plain or goose", format)
}
