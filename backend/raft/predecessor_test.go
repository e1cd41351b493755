package raft

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
)

// Each grant knows the term before it and how that ended: none before the
// first, a resign, a session that expired, one that closed; after a
// restore from a snapshot, the copy of the log does not know and says so
// (nil), rather than "none".
func TestGrantNamesPredecessor(t *testing.T) {
	f := newFSM()
	log := &testLog{t: t}
	apply := func(c command) *result { return log.apply(f, c) }
	for _, s := range []string{"s1", "s2", "s3", "s4"} {
		apply(command{Op: opSessionCreate, Session: s, Node: "m-" + s, TTL: time.Second})
	}
	now := time.Now()
	r1 := apply(command{Op: opAcquire, Session: "s1", Lease: "job", Candidate: "a", Time: now})
	if r1.Prev == nil || !r1.Prev.First {
		t.Fatalf("first grant: prev %+v, want first", r1.Prev)
	}
	apply(command{Op: opAcquire, Session: "s2", Lease: "job", Candidate: "b", Time: now})
	apply(command{Op: opRelease, Session: "s1", Lease: "job", Token: r1.Token, Time: now})
	v, _ := f.lease("job", "s2")
	if v.Candidate != "b" || v.Prev == nil || v.Prev.predecessor() != (baton.Predecessor{Holder: "a", Via: "m-s1", Token: r1.Token, Ended: "resigned"}) {
		t.Fatalf("b's grant from the queue: %+v prev %+v", v, v.Prev)
	}
	apply(command{Op: opAcquire, Session: "s3", Lease: "job", Candidate: "c", Time: now})
	apply(command{Op: opSessionExpire, Session: "s2"})
	v, _ = f.lease("job", "s3")
	if p := v.Prev.predecessor(); v.Candidate != "c" || p.Holder != "b" || !strings.HasPrefix(p.Ended, "expired") {
		t.Fatalf("c's grant after b's session expired: %+v prev %+v", v, p)
	}
	apply(command{Op: opSessionDestroy, Session: "s3"}) // the lease is free and forgotten
	r4 := apply(command{Op: opAcquire, Session: "s4", Lease: "job", Candidate: "d", Time: now})
	if p := r4.Prev.predecessor(); p.Holder != "c" || p.Ended != "released as its process stopped" {
		t.Fatalf("d's grant of a free lease: prev %+v, want c's, closed", p)
	}
	g := restored(t, f)
	if v, _ := g.lease("job", ""); v.Candidate != "d" || v.Prev != nil {
		t.Fatalf("after a restore: %+v prev %+v, want d with no known predecessor", v, v.Prev)
	}
}

// A raft holder's "elected" line, written by its Elector, names the
// previous holder and how its term ended.
func TestElectedLineNamesPredecessor(t *testing.T) {
	nodes := newTestGroup(t, 1).members()
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	elect := func(id string) (*baton.Elector, context.CancelFunc, chan struct{}) {
		b, err := New(nodes[0], Options{Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close(context.Background()) })
		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "job", Candidate: baton.Candidate{ID: id}, Logger: log.With("id", id)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = e.Run(ctx, func(ctx context.Context, _ baton.Term) error { <-ctx.Done(); return nil })
		}()
		return e, cancel, done
	}
	first, stop, done := elect("first")
	if _, err := first.Await(t.Context()); err != nil {
		t.Fatal(err)
	}
	second, stop2, done2 := elect("second")
	defer func() { stop2(); <-done2 }()
	stop()
	<-done
	if _, err := second.Await(t.Context()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, `msg=elected id=first`) || !strings.Contains(out, `baton.previous="none: the first term of this lease"`) {
		t.Errorf("first's elected line does not say it had no predecessor:\n%s", out)
	}
	if !strings.Contains(out, "msg=elected id=second") || !strings.Contains(out, "baton.previous=first baton.previous_via="+nodes[0].ID()) || !strings.Contains(out, "baton.previous_ended=resigned") {
		t.Errorf("second's elected line does not name first, its member and its resign:\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct{ lockedBuffer }

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
