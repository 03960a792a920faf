-- name: CreateInvoice :exec
INSERT INTO invoices (order_id) VALUES (?);
