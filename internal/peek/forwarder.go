package peek

import "reflect"

// forwarderPkg is the package of Watermill's forwarder.
const forwarderPkg = "github.com/ThreeDotsLabs/watermill/components/forwarder"

// ForwarderWrapped returns the publisher that Watermill's forwarder
// Publisher v (a struct) wraps, its unexported wrappedPublisher field, and
// false when v is not that struct or has no such field. Checked against
// Watermill v1.5.1.
func ForwarderWrapped(v reflect.Value) (reflect.Value, bool) {
	t := v.Type()
	if t.Kind() != reflect.Struct || t.PkgPath() != forwarderPkg || t.Name() != "Publisher" {
		return reflect.Value{}, false
	}
	wrapped := v.FieldByName("wrappedPublisher")
	return wrapped, wrapped.IsValid() && wrapped.Kind() == reflect.Interface
}
