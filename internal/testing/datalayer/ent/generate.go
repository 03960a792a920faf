// Package ent is the ent client of the invoices table, generated from
// ./schema: go generate ./ent (from the module's directory).
package ent

//go:generate go run -mod=mod entgo.io/ent/cmd/ent@v0.14.5 generate ./schema
