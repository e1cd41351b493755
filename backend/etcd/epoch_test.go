package etcd_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/etcdserver"
	"github.com/batonhq/baton/internal/testserver"
)

// TestTokensRiseAcrossWipedEtcd is the attack of an etcd that loses its
// data under a running process: stopped, its data directory wiped, and
// restarted on the same address, so its revisions start again at 1. The
// same Backend's next token must be above its last one, and the loss is
// logged. Then the same again for a new process (a new Backend), which has
// only the wall clock to go by.
func TestTokensRiseAcrossWipedEtcd(t *testing.T) {
	dir := t.TempDir()
	srv, err := etcdserver.Start(dir, etcdserver.Options{UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Endpoint()
	t.Cleanup(func() { srv.Close() })
	wipe := func() {
		t.Helper()
		srv.Close()
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if srv, err = etcdserver.Start(dir, etcdserver.Options{UnsafeNoFsync: true, ClientAddr: addr}); err != nil {
			t.Fatalf("restart etcd on %s: %v", addr, err)
		}
	}
	client := testserver.EtcdClient(t, addr)
	logs := &recorder{}
	cfg := baton.Config{TTL: 2 * time.Second}
	b := newBackend(t, client, etcd.Options{Config: cfg, Logger: slog.New(logs)})

	last := termsOn(t, b, 5, 0)
	lastAt := time.Now()
	wipe()
	first := termsOn(t, b, 1, last)
	if !logs.saw("epoch changed") {
		t.Errorf("no warning that etcd lost its data; logged: %q", logs.messages())
	}
	rec, err := b.Leader(context.Background(), "job")
	if !errors.Is(err, baton.ErrNoLeader) {
		t.Fatalf("Leader after resign: %+v, %v", rec, err)
	}
	t.Logf("same process: token %d before the wipe, %d after", last, first)

	// A new process, after another wipe, knows no old epoch: its token is
	// above the old ones by the wall clock alone, given a later second.
	last = termsOn(t, b, 3, first)
	lastAt = time.Now()
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The documented assumption: the new epoch's writer has a clock past
	// the old epoch (the token's high half), which the same process's
	// rewrite above may have set a second ahead of the clock.
	eventuallyTrue(t, 3*time.Second, "the wall clock to pass the last epoch", func() bool {
		now := epoch.Of(time.Now())
		return now > epoch.Of(lastAt) && now > last>>32
	})
	wipe()
	b2 := newBackend(t, client, etcd.Options{Config: cfg})
	first = termsOn(t, b2, 1, last)
	t.Logf("new process: token %d before the wipe, %d after", last, first)
}

// termsOn takes lease "job" n times on b, resigning each term, checks that
// every token is above after (and the one before it), and returns the last
// one. Campaigns that fail are retried, as the Elector does: after etcd
// lost its data the Backend's session is gone and the first one fails.
func termsOn(t *testing.T, b baton.Backend, n int, after uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; i < n; {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		term, err := b.Campaign(ctx, "job", baton.Candidate{ID: "c"})
		cancel()
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("campaign: %v", err)
			}
			time.Sleep(50 * time.Millisecond) // the Elector's back-off
			continue
		}
		if term.Token() <= after {
			t.Fatalf("token %d is not above %d", term.Token(), after)
		}
		after = term.Token()
		ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
		if err := term.Resign(ctx); err != nil {
			t.Fatalf("resign: %v", err)
		}
		cancel()
		i++
	}
	return after
}

func eventuallyTrue(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recorder is a slog.Handler that keeps the messages logged at Warn and up.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) saw(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}
