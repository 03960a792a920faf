// Command mailer is a service of its own for the tests of services sharing one
// inbox table: its handler is named as the other service's.
package main

import "github.com/watermill-inbox/inbox/internal/servicetest"

func main() { servicetest.Main() }
