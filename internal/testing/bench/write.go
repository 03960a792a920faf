package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Write is the business write of one message: the same statements bare
// and behind the inbox (there, in the claim's transaction). How heavy it is
// sets the inbox's share of the cost: the claim writes one row and two index
// entries whatever the handler does.
type Write struct {
	// Kind is one of WriteKinds.
	Kind  string
	stmts []string
	args  func(eventID string) [][]any
	// floorArgs are the same parameters as pgbench expressions, per
	// statement ($n: floorArgs[i][n-1]; "id" stands for the event id's
	// expression), and floorSet the pgbench \set lines they use.
	floorArgs [][]string
	floorSet  []string
	// batch, when set, is the write of n messages as one statement, with
	// their ids as parameters (one-row: a multi-row INSERT).
	batch func(n int) string
	// rowKey, when set, orders a batch's messages by the row their
	// statements update (invoice: the customer), so that concurrent
	// batches lock rows in one order, as a batch handler would.
	rowKey   func(args [][]any) int64
	tables   []string // every table it writes, for the WAL
	appended []string // the tables it only appends to, emptied by ResetWrite
}

// WriteKinds lists the business writes CreateWrite makes:
//
//   - one-row: one row in a table without indexes, the smallest write a
//     handler can make, where the claim is as big as the business write;
//   - invoice: an invoice row (bigint identity key, event id, customer,
//     amount, created_at, an index on customer and time) and the update of
//     the customer's running total, one of CustomerCount rows picked at
//     random per message.
var WriteKinds = []string{"one-row", "invoice"}

// DescribeWrite says what the business write of kind is, as printed.
func DescribeWrite(kind string) string {
	switch kind {
	case "one-row":
		return "one row, no index, own transaction"
	case "invoice":
		return "an invoice row with its key and a secondary index, and the update of a customer's running total, own transaction"
	}
	return kind
}

// CustomerCount is the number of customer_totals rows of the invoice write.
const CustomerCount = 1000

// Tables returns every table w writes.
func (w Write) Tables() []string { return w.tables }

// exec runs w's statements for event id through exec.
func (w Write) exec(ctx context.Context, id string, exec func(ctx context.Context, query string, args ...any) error) error {
	for i, args := range w.args(id) {
		if err := exec(ctx, w.stmts[i], args...); err != nil {
			return err
		}
	}
	return nil
}

// CreateWrite creates the tables of a business write of kind (see
// WriteKinds) under fresh names starting with prefix.
func (a *Admin) CreateWrite(ctx context.Context, kind, prefix string) (Write, error) {
	d := a.d
	var w Write
	var ddl []string
	switch kind {
	case "one-row":
		effects := Name(prefix + "_effects")
		w = Write{
			Kind:      kind,
			stmts:     []string{`INSERT INTO ` + effects + ` (event_id) VALUES (` + d.ph(1) + `)`},
			args:      func(id string) [][]any { return [][]any{{id}} },
			floorArgs: [][]string{{"id"}},
			batch: func(n int) string {
				rows := make([]string, n)
				for i := range rows {
					rows[i] = "(" + d.ph(i+1) + ")"
				}
				return `INSERT INTO ` + effects + ` (event_id) VALUES ` + strings.Join(rows, ", ")
			},
			tables: []string{effects}, appended: []string{effects},
		}
		ddl = []string{`CREATE TABLE ` + effects + ` (event_id ` + d.textType + ` NOT NULL)`}
	case "invoice":
		invoices, totals := Name(prefix+"_invoices"), Name(prefix+"_customer_totals")
		w = Write{
			Kind: kind,
			stmts: []string{
				`INSERT INTO ` + invoices + ` (event_id, customer_id, amount) VALUES (` + d.ph(1) + `, ` + d.ph(2) + `, ` + d.ph(3) + `)`,
				`UPDATE ` + totals + ` SET total = total + ` + d.ph(1) + `, invoices = invoices + 1 WHERE customer_id = ` + d.ph(2),
			},
			args: func(id string) [][]any {
				customer, amount := 1+rand.Int64N(CustomerCount), 1+rand.Int64N(100_000)
				return [][]any{{id, customer, amount}, {amount, customer}}
			},
			rowKey:    func(args [][]any) int64 { return args[1][1].(int64) },
			floorArgs: [][]string{{"id", ":customer", ":amount"}, {":amount", ":customer"}},
			floorSet:  []string{`\set customer random(1, ` + strconv.Itoa(CustomerCount) + `)`, `\set amount random(1, 100000)`},
			tables:    []string{invoices, totals}, appended: []string{invoices},
		}
		seed := make([]string, CustomerCount)
		for i := range seed {
			seed[i] = "(" + strconv.Itoa(i+1) + ")"
		}
		ddl = []string{
			`CREATE TABLE ` + invoices + ` (
	id          ` + d.identity + `,
	event_id    ` + d.textType + ` NOT NULL,
	customer_id bigint NOT NULL,
	amount      bigint NOT NULL,
	created_at  ` + d.createdAt + `
)`,
			`CREATE INDEX ` + invoices + `_customer_idx ON ` + invoices + ` (customer_id, created_at)`,
			`CREATE TABLE ` + totals + ` (customer_id bigint PRIMARY KEY, total bigint NOT NULL DEFAULT 0, invoices bigint NOT NULL DEFAULT 0)`,
			`INSERT INTO ` + totals + ` (customer_id) VALUES ` + strings.Join(seed, ", "),
		}
	default:
		return Write{}, fmt.Errorf("unknown business write %q (known: %s)", kind, strings.Join(WriteKinds, ", "))
	}
	for _, q := range ddl {
		if _, err := a.db.ExecContext(ctx, q); err != nil {
			_ = a.Drop(context.WithoutCancel(ctx), w.tables...)
			return Write{}, fmt.Errorf("creating the %s write's tables: %w", kind, err)
		}
	}
	return w, nil
}

// ResetWrite empties the tables w appends to (the running totals stay).
func (a *Admin) ResetWrite(ctx context.Context, w Write) error { return a.Truncate(ctx, w.appended...) }

// Invoices returns the rows of an invoice write's invoice table and the sum
// of its customers' invoice counts, which every message raises by one.
func (a *Admin) Invoices(ctx context.Context, w Write) (rows, counted int64, err error) {
	if w.Kind != "invoice" {
		return 0, 0, fmt.Errorf("a %s write has no invoices", w.Kind)
	}
	err = a.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM `+w.tables[0]+`), (SELECT COALESCE(SUM(invoices), 0) FROM `+w.tables[1]+`)`).Scan(&rows, &counted)
	return rows, counted, err
}
