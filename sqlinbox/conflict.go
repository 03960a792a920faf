package sqlinbox

// IsConflict reports whether err is the database aborting the transaction
// because a concurrent transaction conflicted with it, so that running the
// message again is the whole remedy: on MySQL and MariaDB error 1213
// (ER_LOCK_DEADLOCK, also what a Galera cluster returns when another node
// committed a conflicting write set first), on PostgreSQL SQLSTATE 40001
// (serialization_failure) and 40P01 (deadlock_detected). The database has
// rolled back the whole transaction in every one of these cases.
//
// On a multi-primary cluster such an error on a handler's own statement or
// at COMMIT, after the claim succeeded, usually means a copy of the event
// committed its claim on another node first; the engine asks this method so
// that it can say so rather than report a handler failure. Errors are
// recognised by error number or SQLSTATE, wherever [errors.As] finds them,
// never by message text.
//
// A lock wait timeout (MySQL 1205, PostgreSQL 55P03) is not a conflict: it
// rolls back only the statement, and on a handler's statement it means a
// lock held too long, not a lost race (on the claim it already wraps
// [inbox.ErrInFlight]). SQLite never reports one: the claim takes the
// database's write lock, so a handler's statements cannot conflict.
func (s *Store) IsConflict(err error) bool { return s.dialect.conflict(err) }
