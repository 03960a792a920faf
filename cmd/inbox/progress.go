package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progressEvery is how often the progress line is redrawn at most.
const progressEvery = 250 * time.Millisecond

// progress shows a purge round on one line of a terminal, redrawn in place
// after batches: rows removed, rows per second and, against the count of
// expired rows taken before the round, the time left. It is also the
// logger's output, so that a log line never lands inside the progress line.
// A nil *progress shows nothing.
type progress struct {
	w     io.Writer
	table string

	mu              sync.Mutex
	began, drawn    time.Time
	done, expected  int64
	dirty, onScreen bool // undrawn progress; a line without its newline
}

// isTerminal reports whether w is a terminal (a character device), where
// progress can be redrawn in place; in a pipe, a file or a log collector it
// would only add noise.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// counting says that the expired rows are being counted, which takes a
// while on a large table.
func (p *progress) counting() {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\rpurging %s: counting the expired rows\x1b[K", p.table)
	p.onScreen = true
}

func (p *progress) start(expected int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.began, p.expected = time.Now(), expected
	p.draw()
}

// batch is the purge's OnBatch hook.
func (p *progress) batch(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	p.dirty = true
	if time.Since(p.drawn) >= progressEvery {
		p.draw()
	}
}

// finish draws the last state and ends the line.
func (p *progress) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLine()
}

// Write ends the progress line, then writes b below it.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLine()
	return p.w.Write(b)
}

func (p *progress) endLine() {
	if p.dirty {
		p.draw()
	}
	if p.onScreen {
		fmt.Fprintln(p.w)
		p.onScreen = false
	}
}

func (p *progress) draw() {
	now := time.Now()
	elapsed := now.Sub(p.began)
	line := fmt.Sprintf("purging %s: %d", p.table, p.done)
	if p.done <= p.expected {
		line += fmt.Sprintf(" of about %d rows (%d%%)", p.expected, percent(p.done, p.expected))
	} else {
		line += " rows (more expired meanwhile)"
	}
	if elapsed > 0 && p.done > 0 {
		rate := float64(p.done) / elapsed.Seconds()
		line += fmt.Sprintf(", %.0f rows/s", rate)
		if left := p.expected - p.done; left > 0 {
			line += fmt.Sprintf(", about %s left", time.Duration(float64(left)/rate*float64(time.Second)).Round(time.Second))
		}
	}
	// \r returns to the line's start, \x1b[K clears what a longer earlier
	// line left behind.
	fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	p.drawn, p.dirty, p.onScreen = now, false, true
}

func percent(done, of int64) int64 {
	if of == 0 {
		return 100
	}
	return done * 100 / of
}
