//go:build linux && !batonpgroup

package supervise

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/internal/testkit"
)

// A command that exits by itself ends Lead with its status, and saw the
// term's BATON_ variables.
func TestRunnerLeadExit(t *testing.T) {
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	r := &Runner{
		Config: Config{
			Command: []string{"sh", "-c", `echo "$BATON_LEASE $BATON_TOKEN $BATON_HOLDER $EXTRA"; exit 7`},
			Env:     []string{"EXTRA=x", "PATH=" + os.Getenv("PATH")},
			Stdout:  out,
			Grace:   100 * time.Millisecond,
		},
		Holder: "host/1",
	}
	defer r.Close()
	term := backend.NewBasicTerm("nightly", 42, time.Now().Add(time.Minute), nil)
	err = r.Lead(t.Context(), term)
	var exited *ExitError
	if !errors.As(err, &exited) || exited.Code != 7 {
		t.Fatalf("Lead = %v, want an ExitError with status 7", err)
	}
	printed, _ := os.ReadFile(out.Name())
	if got := strings.TrimSpace(string(printed)); got != "nightly 42 host/1 x" {
		t.Errorf("the command printed %q, want the lease, token, holder and its own environment", got)
	}
}

// A term that ends stops the command (and Lead returns nil, or with Once
// ErrTermEnded); a caller that stops is not a lost term.
func TestRunnerLeadTermEnds(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		once bool
		end  func(term *backend.BasicTerm, cancel context.CancelFunc)
		want error
	}{
		{"lost", false, func(term *backend.BasicTerm, _ context.CancelFunc) { term.End(baton.ErrLeaseLost) }, nil},
		{"lost once", true, func(term *backend.BasicTerm, _ context.CancelFunc) { term.End(baton.ErrLeaseLost) }, ErrTermEnded},
		{"caller stops once", true, func(_ *backend.BasicTerm, cancel context.CancelFunc) { cancel() }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			started := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			r := &Runner{
				Config: Config{Command: []string{"sh", "-c", `touch "$0"; exec sleep 1000`, started}, Grace: 100 * time.Millisecond},
				Once:   tc.once,
			}
			defer r.Close()
			term := backend.NewBasicTerm("l", 1, time.Now().Add(time.Minute), nil)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- baton.Lead(ctx, term, baton.LeadConfig{}, r.Lead) }()
			testkit.Eventually(t, 10*time.Second, "the command to start", func() bool {
				_, err := os.Stat(started)
				return err == nil
			})
			tc.end(term, cancel)
			if err := <-done; !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Errorf("Lead = %v, want %v", err, tc.want)
			}
		})
	}
}

// Close may be called more than once, also on a Runner that never started
// a command: each call returns once the background work is over.
func TestRunnerCloseTwice(t *testing.T) {
	defer Discard() // should the delay pass before Close on a slow machine
	r := &Runner{Config: Config{Command: []string{"true"}}, Prepare: true}
	r.prepareNext() // as Start does after a command started
	r.Close()
	r.Close()
	var zero Runner
	zero.Close()
	zero.Close()
}
