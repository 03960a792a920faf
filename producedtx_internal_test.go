package inbox

import (
	"database/sql"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
)

// wsqlLike has the shape of a watermill-sql v4 publisher: its handle in an
// interface field, wrapped as sql.TxFromStdSQL or sql.BeginnerFromStdSQL
// wrap theirs, beside a config, a wait group, a channel and a sync.Map.
type wsqlLike struct {
	//lint:ignore U1000 never read: it is part of the shape handleIn walks
	config struct {
		SchemaAdapter        any
		AutoInitializeSchema bool
	}
	db        any
	publishWg *sync.WaitGroup
	closeCh   chan struct{}
	//lint:ignore U1000 never read: it is part of the shape handleIn walks
	closed bool
	topics sync.Map
	logger watermill.LoggerAdapter
}

type stdTx struct{ *sql.Tx }
type stdBeginner struct{ db any }

func newWSQLLike(db any) *wsqlLike {
	p := &wsqlLike{db: db, publishWg: &sync.WaitGroup{}, closeCh: make(chan struct{}), logger: watermill.NopLogger{}}
	p.topics.Store("t", struct{}{})
	return p
}

func TestHandleIn(t *testing.T) {
	t.Parallel()
	ours, theirs, db := &sql.Tx{}, &sql.Tx{}, &sql.DB{}
	for _, tc := range []struct {
		name  string
		pub   any
		held  bool
		other string
	}{
		{"the transaction", newWSQLLike(&stdTx{ours}), true, ""},
		{"the transaction itself (watermill-sql v3)", struct{ db any }{ours}, true, ""},
		{"the pool", newWSQLLike(stdBeginner{db}), false, "a *sql.DB"},
		{"another transaction", newWSQLLike(&stdTx{theirs}), false, "another transaction (*sql.Tx)"},
		{"the transaction and the pool", struct{ a, b any }{db, ours}, true, "a *sql.DB"},
		{"nothing", newWSQLLike(nil), false, ""},
		{"a cycle", func() any { type node struct{ next any }; n := &node{}; n.next = n; return n }(), false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held, other := handleIn(tc.pub, ours)
			require.Equal(t, tc.held, held)
			if !tc.held {
				require.Equal(t, tc.other, other)
			}
		})
	}
}

// BenchmarkHandleIn is what looking inside a watermill-sql-shaped
// publisher costs per produced batch.
//
//	go test -run '^$' -bench BenchmarkHandleIn .
func BenchmarkHandleIn(b *testing.B) {
	tx := &sql.Tx{}
	pub := newWSQLLike(&stdTx{tx})
	b.ReportAllocs()
	for b.Loop() {
		if held, _ := handleIn(pub, tx); !held {
			b.Fatal("not found")
		}
	}
}
