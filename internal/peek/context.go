package peek

import (
	"context"
	"reflect"
)

var contextType = reflect.TypeFor[context.Context]()

// ContextFields lists, for a context's struct type t, the index paths (for
// [reflect.Value.FieldByIndex], through embedded structs) of the fields
// that hold a parent context and of the interface fields named key, where
// [context.WithValue]'s valueCtx keeps its key. The standard library's
// contexts keep their parent in an embedded Context (valueCtx, cancelCtx,
// and timerCtx and afterFuncCtx through their embedded cancelCtx) or in c
// (withoutCancelCtx). Only fields that never change after the context is
// made are listed: a cancelCtx's err and cause are written by cancel,
// without a lock a reader could take. Checked against Go 1.25 and 1.26.
func ContextFields(t reflect.Type) (parents, keys [][]int) {
	var add func(t reflect.Type, prefix []int)
	add = func(t reflect.Type, prefix []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			path := append(append([]int(nil), prefix...), i)
			switch {
			case f.Type.Implements(contextType):
				parents = append(parents, path)
			case f.Anonymous && f.Type.Kind() == reflect.Struct:
				add(f.Type, path)
			case f.Type.Kind() == reflect.Interface && f.Name == "key":
				keys = append(keys, path)
			}
		}
	}
	add(t, nil)
	return parents, keys
}
