package raft

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/testkit"
)

// funcReloader is a Reloader whose answers the test sets.
type funcReloader struct {
	mu      sync.Mutex
	secrets []string
	err     error
	calls   int
}

func (r *funcReloader) Reload(context.Context) ([]string, *tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return slices.Clone(r.secrets), nil, r.err
}

func (r *funcReloader) set(secrets []string, err error) {
	r.mu.Lock()
	r.secrets, r.err = secrets, err
	r.mu.Unlock()
}

func (r *funcReloader) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// TestReloaderReplacesSecrets: a member takes the secrets its Reloader
// returns; a failing reload, or one with a secret too short, keeps what the
// member holds and is logged once per run of failures.
func TestReloaderReplacesSecrets(t *testing.T) {
	const next = "0123456789abcdef-the-next-secret"
	rec := &attrRecorder{}
	rl := &funcReloader{secrets: []string{testSecret}}
	g := newTestGroup(t, 1, func(o *NodeOptions) {
		o.Secret, o.Reloader, o.ReloadEvery, o.Logger = testSecret, rl, 20*time.Millisecond, slog.New(rec)
		o.TLS = nil
	})
	n := g.members()[0]
	rl.set([]string{testSecret, next}, nil)
	waitHeld(t, n, []string{testSecret, next})

	rl.set(nil, errors.New("the store is down"))
	calls := rl.callCount()
	testkit.Eventually(t, 20*time.Second, "several failed reloads", func() bool { return rl.callCount() >= calls+5 })
	rl.set([]string{"short"}, nil)
	testkit.Eventually(t, 20*time.Second, "a reload with a short secret", func() bool { return rl.callCount() >= calls+10 })
	if got := n.secretsHeld(); !slices.Equal(got, []string{testSecret, next}) {
		t.Fatalf("after failed reloads the member holds %q, want what it held", got)
	}
	rl.set([]string{next}, nil)
	waitHeld(t, n, []string{next})
	var warns, recovered int
	for _, r := range rec.all() {
		switch {
		case r.level == slog.LevelWarn && r.msg == "could not reload the secret or the TLS files; keeping those in use and retrying":
			warns++
		case r.msg == "reloading the secret and the TLS files works again":
			recovered++
		}
	}
	if warns != 1 || recovered != 1 {
		t.Fatalf("%d warnings and %d recoveries logged for one run of failures, want 1 and 1: %+v", warns, recovered, rec.all())
	}
}

func TestSetSecretsAndTLSRefuseBadValues(t *testing.T) {
	g := newTestGroup(t, 1)
	n := g.members()[0]
	var ce *baton.ConfigError
	if err := n.SetSecrets("short"); !errors.As(err, &ce) {
		t.Fatalf("SetSecrets(short): %v, want a *baton.ConfigError", err)
	}
	if err := n.SetSecrets(testSecret, "short"); !errors.As(err, &ce) {
		t.Fatalf("SetSecrets with a short previous secret: %v, want a *baton.ConfigError", err)
	}
	if err := n.SetTLS(nil); !errors.As(err, &ce) {
		t.Fatalf("SetTLS(nil): %v, want a *baton.ConfigError", err)
	}
	self, err := selfSignedTLS("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SetTLS(self); !errors.As(err, &ce) {
		t.Fatalf("SetTLS(a config that verifies no CA): %v, want a *baton.ConfigError", err)
	}
	if got := n.secretsHeld(); !slices.Equal(got, []string{g.secret}) {
		t.Fatalf("after refused calls the member holds %q, want its secret", got)
	}
}

// TestSetTLSRefusedInSecretOnlyMode: a member started without TLS keeps
// its mode: SetTLS with a CA configuration is refused, not a silent switch
// that would make it refuse its secret-only peers.
func TestSetTLSRefusedInSecretOnlyMode(t *testing.T) {
	g := newTestGroup(t, 1)
	opts := g.options(t)
	opts.TLS = nil
	opts.BootstrapExpect = 1
	n, err := StartNode(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close(context.Background()) })
	cfg, err := g.ca.Config("m", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	var ce *baton.ConfigError
	if err := n.SetTLS(cfg); !errors.As(err, &ce) {
		t.Fatalf("SetTLS on a secret-only member: %v, want a *baton.ConfigError", err)
	}
}

func waitHeld(t *testing.T, n *Node, want []string) {
	t.Helper()
	testkit.Eventually(t, 20*time.Second, "the member to hold the reloaded secrets", func() bool { return slices.Equal(n.secretsHeld(), want) })
}

// TestReloadOfRepeatedSecretChangesNothing: a value that names a secret
// twice (a file with the same line twice) holds the same secrets as one
// that names it once, so reloading it logs no change: "the group's
// secrets changed" is what an operator checks between a rotation's steps.
func TestReloadOfRepeatedSecretChangesNothing(t *testing.T) {
	rec := &attrRecorder{}
	rl := &funcReloader{secrets: []string{testSecret, testSecret}}
	g := newTestGroup(t, 1, func(o *NodeOptions) {
		o.Secret, o.Reloader, o.ReloadEvery, o.Logger = testSecret, rl, 20*time.Millisecond, slog.New(rec)
		o.TLS = nil
	})
	n := g.members()[0]
	calls := rl.callCount()
	testkit.Eventually(t, 20*time.Second, "several reloads", func() bool { return rl.callCount() >= calls+5 })
	for _, r := range rec.all() {
		if r.msg == "the group's secrets changed" {
			t.Fatalf("a reload of the secret the member holds, named twice, was logged as a change: %+v", r)
		}
	}
	if got := n.secretsHeld(); !slices.Equal(got, []string{testSecret}) {
		t.Fatalf("the member holds %q, want %q", got, testSecret)
	}
}
