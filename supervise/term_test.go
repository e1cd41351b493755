//go:build linux && !batonpgroup

package supervise

import (
	"sync/atomic"
	"testing"
	"time"
)

// renewedTerm is a term whose safe-until moves from first to later after
// it was first read, as a renewal confirmed while the guard was starting
// moves it, and then never moves again.
type renewedTerm struct {
	reads        atomic.Int32
	first, later time.Time
	done         chan struct{}
}

func (t *renewedTerm) SafeUntil() time.Time {
	if t.reads.Add(1) == 1 {
		return t.first
	}
	return t.later
}
func (t *renewedTerm) Done() <-chan struct{} { return t.done }
func (t *renewedTerm) Err() error            { return nil }

// A renewal confirmed while the guard was starting moved the term's
// safe-until past the deadline the guard started with; the TermProcess
// passes it on although it sees no move after it began, so the guard does
// not stop the command of a healthy term.
func TestStartTermPassesOnARenewalDuringStart(t *testing.T) {
	started := time.Now().Add(500 * time.Millisecond)
	term := &renewedTerm{first: started, later: time.Now().Add(time.Minute), done: make(chan struct{})}
	p, err := StartTerm(term, Config{
		Command: []string{"sleep", "1000"},
		Grace:   100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Stop(t.Context())
		p.Close()
	})
	select {
	case <-p.Done():
		t.Fatalf("the guard stopped the command of a term safe for a minute: %v", p.Err())
	case <-time.After(time.Until(started) + time.Second): // past the start deadline
	}
}
