package peek_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/watermill-inbox/inbox/internal/peek"
)

type markerKey struct{}

// valueKey is a key whose text the test reads back.
type valueKey string

// Every context the standard library makes is read as the subscriber
// transaction's finder reads it: ContextFields finds exactly one parent
// field, which holds the context it was made from, and WithValue's key. A
// Go release that renames those fields fails here, instead of letting the
// finder stop at the first context it no longer understands.
func TestContextFieldsFindEveryStandardContext(t *testing.T) {
	t.Parallel()
	parent := context.WithValue(context.Background(), markerKey{}, "parent")
	cause := errors.New("cause")
	for _, tc := range []struct {
		name string
		make func(t *testing.T) context.Context
		key  string // the key a WithValue holds
	}{
		{"WithValue", func(*testing.T) context.Context { return context.WithValue(parent, valueKey("key"), 1) }, "key"},
		{"WithCancel", func(t *testing.T) context.Context {
			ctx, cancel := context.WithCancel(parent)
			t.Cleanup(cancel)
			return ctx
		}, ""},
		{"WithCancelCause", func(t *testing.T) context.Context {
			ctx, cancel := context.WithCancelCause(parent)
			t.Cleanup(func() { cancel(nil) })
			return ctx
		}, ""},
		{"WithTimeout", func(t *testing.T) context.Context {
			ctx, cancel := context.WithTimeout(parent, time.Hour)
			t.Cleanup(cancel)
			return ctx
		}, ""},
		{"WithDeadlineCause", func(t *testing.T) context.Context {
			ctx, cancel := context.WithDeadlineCause(parent, time.Now().Add(time.Hour), cause)
			t.Cleanup(cancel)
			return ctx
		}, ""},
		{"WithoutCancel", func(*testing.T) context.Context { return context.WithoutCancel(parent) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := tc.make(t)
			v := reflect.ValueOf(ctx)
			if v.Kind() == reflect.Pointer { // all but withoutCancelCtx
				v = v.Elem()
			}
			require.Equal(t, reflect.Struct, v.Kind())
			parents, keys := peek.ContextFields(v.Type())
			require.Len(t, parents, 1, "%s: one parent field", v.Type())
			require.True(t, holds(v.FieldByIndex(parents[0]), parent), "the parent field holds the context it was made from")
			if tc.key == "" {
				require.Empty(t, keys)
				return
			}
			require.Len(t, keys, 1)
			key := v.FieldByIndex(keys[0]).Elem()
			require.Equal(t, reflect.String, key.Kind())
			require.Equal(t, tc.key, key.String())
		})
	}
}

// holds reports whether the interface field f, which may be unexported
// (reflect then refuses Interface), holds the pointer x.
func holds(f reflect.Value, x any) bool {
	return f.Kind() == reflect.Interface && !f.IsNil() && f.Elem().Type() == reflect.TypeOf(x) &&
		f.Elem().Pointer() == reflect.ValueOf(x).Pointer()
}
