-- The handler's effect: one invoice per order. No unique key on order_id,
-- so that an effect applied twice shows up as a second row.
CREATE TABLE invoices (
	id       integer PRIMARY KEY AUTOINCREMENT,
	order_id text NOT NULL
);
