package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	inbox "github.com/watermill-inbox/inbox"
	"github.com/watermill-inbox/inbox/internal/testdb"
	"github.com/watermill-inbox/inbox/sqlinbox"
)

type recorder struct {
	mu  sync.Mutex
	obs []inbox.Observation
}

type ctxMark struct{}

func (r *recorder) Start(ctx context.Context) (context.Context, func(inbox.Observation)) {
	return context.WithValue(ctx, ctxMark{}, true), func(ob inbox.Observation) {
		r.mu.Lock()
		r.obs = append(r.obs, ob)
		r.mu.Unlock()
	}
}

func (r *recorder) outcomes() []inbox.Outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]inbox.Outcome, len(r.obs))
	for i, ob := range r.obs {
		out[i] = ob.Outcome
	}
	return out
}

func TestObserverSeesEveryOutcome(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t)
	store, err := sqlinbox.New(db, sqlinbox.Config{Dialect: sqlinbox.SQLite})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(context.Background()))
	rec := &recorder{}
	mw, err := inbox.NewMiddleware(inbox.Config{Store: store, Consumer: "c", Observer: inbox.Observers(rec)})
	require.NoError(t, err)

	msg := func(id string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), nil)
		if id != "" {
			m.Metadata.Set("event_id", id)
		}
		return m
	}
	ok := func(msg *message.Message) ([]*message.Message, error) {
		require.Equal(t, true, msg.Context().Value(ctxMark{}), "the observer's context reaches the handler")
		return nil, nil
	}
	boom := errors.New("boom")
	fail := func(*message.Message) ([]*message.Message, error) { return nil, boom }

	_, err = mw(ok)(msg("a"))
	require.NoError(t, err)
	_, err = mw(ok)(msg("a"))
	require.NoError(t, err)
	_, err = mw(ok)(msg("a\x00"))
	require.Error(t, err)
	noID := message.NewMessage("", nil)
	_, err = mw(ok)(noID)
	require.Error(t, err)
	_, err = mw(fail)(msg("b"))
	require.ErrorIs(t, err, boom)
	require.Panics(t, func() {
		_, _ = mw(func(*message.Message) ([]*message.Message, error) { panic("p") })(msg("c"))
	})

	require.Equal(t, []inbox.Outcome{
		inbox.OutcomeProcessed, inbox.OutcomeDuplicate, inbox.OutcomeInvalidID, inbox.OutcomeMissingID,
		inbox.OutcomeRolledBack, inbox.OutcomeRolledBack,
	}, rec.outcomes())
	first := rec.obs[0]
	require.Equal(t, "c", first.Consumer)
	require.Equal(t, "a", first.EventID)
	require.Positive(t, first.ClaimDuration)
	require.GreaterOrEqual(t, first.Duration, first.ClaimDuration)
	require.ErrorIs(t, rec.obs[4].Err, boom)

	require.NoError(t, db.Close())
	_, err = mw(ok)(msg("d"))
	require.Error(t, err)
	require.Equal(t, inbox.OutcomeClaimFailed, rec.outcomes()[6])
}
