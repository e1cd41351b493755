package main

import (
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/supervise"
)

// A renewal confirmed while the guard was starting moved the term's
// safe-until past the deadline the guard started with; extendGuard passes
// it on although it sees no move after it began, so the guard does not stop
// the command of a healthy term.
func TestExtendGuardPassesOnARenewalDuringStart(t *testing.T) {
	started := time.Now().Add(500 * time.Millisecond)
	p, err := supervise.Start(supervise.Config{
		Command:  []string{"sleep", "1000"},
		Grace:    100 * time.Millisecond,
		Deadline: started,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(t.Context()) })
	// The renewal that landed between the two reads: the term is already
	// safe for a minute when extendGuard begins, and is not renewed again.
	term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Minute), nil)
	stop := extendGuard(p, term)
	defer stop()
	select {
	case <-p.Done():
		t.Fatalf("the guard stopped the command of a term safe for a minute: %v", p.Err())
	case <-time.After(time.Until(started) + time.Second): // past the start deadline
	}
}
