package consul_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/epoch"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// TestTokensRiseAcrossRestartedConsul is the attack of a Consul that loses
// its data under a running process: a -dev agent (it keeps everything in
// memory) stopped and started again behind the same address, so its raft
// indexes start again from the bottom. The same Backend's next token must
// be above its last one, and the loss is logged. Then the same again for a
// new process, which has only the wall clock to go by.
func TestTokensRiseAcrossRestartedConsul(t *testing.T) {
	srv := testserver.StartConsul(t, testserver.ConsulOptions{})
	proxy := testserver.StartProxy(t, srv.Addr())
	restart := func() {
		t.Helper()
		srv.Close()
		srv = testserver.StartConsul(t, testserver.ConsulOptions{})
		proxy.Retarget(srv.Addr())
	}
	client := srv.Client(t, proxy.Addr())
	cfg := baton.Config{TTL: 2 * time.Second}
	logs := &warnings{}
	gone := make(chan struct{}) // its agent is gone: Close may fail
	close(gone)
	b := newBackend(t, client, consul.Options{Config: cfg, Prefix: testPrefix(), Logger: slog.New(logs)}, gone)

	last := termsOn(t, b, 5, 0)
	lastAt := time.Now()
	restart()
	first := termsOn(t, b, 1, last)
	if !logs.saw("epoch changed") {
		t.Errorf("no warning that Consul lost its data; logged: %q", logs.messages())
	}
	t.Logf("same process: token %d before the restart, %d after", last, first)

	last = termsOn(t, b, 3, first)
	lastAt = time.Now()
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The documented assumption: the new epoch's writer has a clock past
	// the old epoch (the token's high half), which the same process's
	// rewrite above may have set a second ahead of the clock.
	eventually(t, 3*time.Second, func() error {
		if now := epoch.Of(time.Now()); now <= epoch.Of(lastAt) || now <= last>>32 {
			return errNotYet
		}
		return nil
	})
	restart()
	b2 := newBackend(t, client, consul.Options{Config: cfg, Prefix: testPrefix()}, nil)
	first = termsOn(t, b2, 1, last)
	t.Logf("new process: token %d before the restart, %d after", last, first)
}

type notYetError struct{}

func (notYetError) Error() string { return "the wall clock has not passed the last term's second" }

var errNotYet error = notYetError{}

// termsOn takes lease "job" n times on b, resigning each term, checks that
// every token is above after (and the one before it) and that Leader
// reports it, and returns the last one. Failed campaigns are retried, as
// the Elector does: after Consul lost its data the Backend's session is
// gone and the first one fails.
func termsOn(t *testing.T, b *consul.Backend, n int, after uint64) uint64 {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; i < n; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
		rec, err := b.Leader(context.Background(), "job")
		if err != nil || rec.Token != term.Token() {
			t.Fatalf("Leader = %+v, %v; want token %d", rec, err, term.Token())
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

// warnings is a slog.Handler that keeps the messages logged at Warn and up.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, rec slog.Record) error {
	w.mu.Lock()
	w.msgs = append(w.msgs, rec.Message)
	w.mu.Unlock()
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) saw(sub string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

func (w *warnings) messages() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// tokenAt returns the token of a term of lease name that locked its key at
// index: the lease's epoch, read from its epoch key, <<32 + index.
func tokenAt(t *testing.T, c *api.Client, b *consul.Backend, name string, index uint64) uint64 {
	t.Helper()
	key, err := b.EpochKey(name)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := c.KV().Get(key, &api.QueryOptions{RequireConsistent: true})
	if err != nil || p == nil {
		t.Fatalf("epoch key %s: %+v, %v", key, p, err)
	}
	if p.Session != "" || p.Flags != 0 {
		t.Errorf("epoch key %s = %+v; want no session, no flags", key, p)
	}
	e, err := epoch.Parse(string(p.Value))
	if err != nil {
		t.Fatalf("epoch key %s: %v", key, err)
	}
	return epoch.Token(e, index)
}
