package sqlinbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// ErrVitessMultiTransactions is returned by the first claim through a Vitess
// vtgate whose session runs with transaction_mode MULTI: there a transaction
// that reaches a second shard commits shard by shard, and a failure between
// the shards' commits keeps the claim without the handler's rows, or the
// rows without the claim. SINGLE refuses such a transaction instead (the
// handler's statement fails, everything rolls back); TWOPC commits it
// atomically.
var ErrVitessMultiTransactions = errors.New("sqlinbox: Vitess commits a transaction spanning shards shard by shard (transaction_mode MULTI); set vtgate --transaction-mode=SINGLE or the DSN parameter transaction_mode=%27single%27")

// mysqlUnknownSystemVariable is ER_UNKNOWN_SYSTEM_VARIABLE: MySQL and
// MariaDB have no @@transaction_mode, only Vitess's vtgate does.
const mysqlUnknownSystemVariable = 1193

// checkVitessTransactionMode reads the session's transaction_mode, which
// only vtgate knows, and refuses MULTI; vitess reports whether vtgate
// answered. One statement on one connection of the pool, once per
// [Store]: the mode comes from vtgate's flag or from the DSN, the same for
// every connection.
func checkVitessTransactionMode(ctx context.Context, db *sql.DB) (vitess bool, err error) {
	var mode string
	err = db.QueryRowContext(ctx, "SELECT @@transaction_mode").Scan(&mode)
	if n, ok := mysqlErrorNumber(err); ok && n == mysqlUnknownSystemVariable {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sqlinbox: checking for Vitess's transaction_mode: %w", MySQL.classify(err))
	}
	if strings.EqualFold(mode, "multi") {
		return true, ErrVitessMultiTransactions
	}
	return true, nil
}
