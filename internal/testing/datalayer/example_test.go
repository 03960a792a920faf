package datalayer_test

import (
	"context"
	"database/sql"
	"log"

	"entgo.io/ent/dialect"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/sqlc/pgsql"
	"github.com/watermill-inbox/inbox/internal/testing/datalayer/sqlc/pgxv5"
	"github.com/watermill-inbox/inbox/pgxinbox"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

// The examples show what each data layer adds to the inbox on PostgreSQL:
// its setup here, its handler in the tests, which run it on every
// database. (Not run: they need a PostgreSQL server.)

const dsn = "postgres://postgres@127.0.0.1:5432/app"

// GORM, opened once on the pool the store claims on.
func Example_gorm() {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: db}), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	serve(db, gormHandler(gdb))
}

// sqlc's database/sql code.
func Example_sqlc() {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	queries := pgsql.New(db)
	serve(db, sqlcHandler(queries))
}

// sqlc's pgx/v5 code, with the native pgx store.
func Example_sqlcPgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	queries := pgxv5.New(pool)
	store, err := pgxinbox.NewStore(pool, sqlinbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	run(store, sqlcPgxHandler(queries))
}

// ent's generated client, one per message on the inbox transaction: there
// is nothing to open once.
func Example_ent() {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	serve(db, entHandler(dialect.Postgres))
}

// bun, opened once on the pool.
func Example_bun() {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	bdb := bun.NewDB(db, pgdialect.New())
	serve(db, bunHandler(bdb))
}

// sqlx, opened once on the pool.
func Example_sqlx() {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	xdb := sqlx.NewDb(db, "pgx")
	serve(db, sqlxHandler(xdb))
}

// serve runs the inbox on db with handle behind it.
func serve(db *sql.DB, handle message.NoPublishHandlerFunc) {
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.PostgreSQL})
	if err != nil {
		log.Fatal(err)
	}
	run(store, handle)
}

// run is the README's quick start, on any store.
func run(store inboxdriver.Store, handle message.NoPublishHandlerFunc) {
	ctx := context.Background()
	logger := watermill.NewStdLogger(false, false)
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Logger: logger})
	if err != nil {
		log.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		log.Fatal(err)
	}
	router.AddMiddleware(middleware.Recoverer)
	orders := gochannel.NewGoChannel(gochannel.Config{}, logger) // Kafka, AMQP...: any subscriber
	router.AddConsumerHandler("invoicing", "orders", orders, inbox.ConsumerHandler(mw, handle))
	if err := router.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
