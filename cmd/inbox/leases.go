package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// printLeases reports the consumers of live processes: a consumer two
// services claim for at the same time fails (each event runs in only one of
// them), and a process's warnings about a consumer's wiring are listed
// without failing, since they are suspicions. It returns how many failed.
func printLeases(w io.Writer, leases []maintenance.Lease) int {
	type consumer struct {
		services []string
		warnings []string
	}
	var names []string
	live := map[string]*consumer{}
	for _, l := range leases {
		if l.Age > inboxdriver.LeaseTTL {
			continue
		}
		c := live[l.Consumer]
		if c == nil {
			c = &consumer{}
			live[l.Consumer] = c
			names = append(names, l.Consumer)
		}
		if !slices.Contains(c.services, l.Service) {
			c.services = append(c.services, l.Service)
		}
		for _, warning := range strings.Split(l.Warnings, ",") {
			if warning != "" {
				c.warnings = append(c.warnings, fmt.Sprintf("%s (service %s, process %s)", warning, l.Service, l.Instance))
			}
		}
	}
	if len(names) == 0 {
		fmt.Fprintf(w, "-     consumers: no process claimed in the last %s\n", inboxdriver.LeaseTTL)
		return 0
	}
	failed := 0
	for _, name := range names {
		c := live[name]
		if len(c.services) > 1 {
			failed++
			fmt.Fprintf(w, "FAIL  consumer %q: services %s claim for it at the same time, so each event runs in only one of them\n", name, strings.Join(c.services, " and "))
			fmt.Fprintf(w, "      give each service's handlers names of their own (inbox.Config.Consumer), or one inbox.Config.Service if they are one service\n")
		} else {
			fmt.Fprintf(w, "ok    consumer %q: claimed by service %s\n", name, c.services[0])
		}
		for _, warning := range c.warnings {
			fmt.Fprintf(w, "WARN  consumer %q: %s; see docs/wiring.md#run-time-checks\n", name, warning)
		}
	}
	return failed
}
