package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/watermill-inbox/inbox/inboxdriver"
	"github.com/watermill-inbox/inbox/internal/maintenance"
)

// claimingNow is how recently a lease must have been renewed for its
// process to count as claiming now: one renewal period, and some slack for
// a message arriving late.
const claimingNow = inboxdriver.LeaseRenewal + 10*time.Second

// printLeases reports the consumers of live processes: a consumer two
// services claim for now fails (each event runs in only one of them); a
// live lease of a process that stopped claiming or ran only briefly (a
// finished test run, the service before a rename) is a warning, as are a
// process's warnings about a consumer's wiring. It returns how many
// failed.
func printLeases(w io.Writer, leases []maintenance.Lease) int {
	type consumer struct {
		services []string // live
		now      []string // claiming now, for longer than a renewal
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
		if l.Age <= claimingNow && l.Claiming >= inboxdriver.LeaseRenewal && !slices.Contains(c.now, l.Service) {
			c.now = append(c.now, l.Service)
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
		switch {
		case len(c.now) > 1:
			failed++
			fmt.Fprintf(w, "FAIL  consumer %q: services %s claim for it now, so each event runs in only one of them\n", name, strings.Join(c.now, " and "))
			fmt.Fprintf(w, "      give each service's handlers names of their own (inbox.Config.Consumer), or one inbox.Config.Service if they are one service\n")
		case len(c.services) > 1:
			fmt.Fprintf(w, "WARN  consumer %q: services %s claimed for it within %s, not both for long or not now (a finished test run, a renamed service); see docs/wiring.md#consumers\n", name, strings.Join(c.services, " and "), inboxdriver.LeaseTTL)
		default:
			fmt.Fprintf(w, "ok    consumer %q: claimed by service %s\n", name, c.services[0])
		}
		for _, warning := range c.warnings {
			fmt.Fprintf(w, "WARN  consumer %q: %s; see docs/wiring.md#run-time-checks\n", name, warning)
		}
	}
	return failed
}
