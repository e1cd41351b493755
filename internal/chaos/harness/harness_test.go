package harness

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"
)

// The test binary is also the children's writer: the harness runs it with
// BATON_CHAOS_CHILD=1.
func TestMain(m *testing.M) {
	if os.Getenv("BATON_CHAOS_CHILD") == "1" {
		os.Exit(ChildMain(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

func shortRun(t *testing.T, cfg Config) Config {
	t.Helper()
	cfg.Dir = t.TempDir()
	if d := os.Getenv("D"); d != "" {
		cfg.Dir = d
	}
	cfg.Child = []string{"env", "BATON_CHAOS_CHILD=1", os.Args[0]}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	return cfg
}

func TestSmoke(t *testing.T) {
	cfg := shortRun(t, Config{Backend: os.Getenv("B"), Faults: 10, Interval: time.Second, Seed: 1})
	hist, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	acc := 0
	for _, w := range hist.Writes {
		if w.Accepted {
			acc++
		}
	}
	t.Logf("%d writes, %d accepted, %d faults, %s", len(hist.Writes), acc, len(hist.Faults), hist.Run.Duration)
	for _, f := range hist.Faults {
		t.Logf("%+v", f)
	}
}
