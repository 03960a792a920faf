package sqlinbox

// MySQLErrorNumber exposes mysqlErrorNumber to the tests that reach a real
// server, which live in package sqlinbox_test (they import internal/testdb,
// which imports sqlinbox).
var MySQLErrorNumber = mysqlErrorNumber
