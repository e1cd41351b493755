package main

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"slices"
	"sync"
	"testing"
)

// reporter is a helper process (this test binary in one of its roles) that
// prints readyLine once it is ready and then one JSON record of type T per
// line for what it saw.
type reporter[T any] struct {
	ready <-chan struct{} // closed when it printed readyLine
	done  <-chan struct{} // closed when its output ended (it exited)

	stderr *lockedWriter

	mu      sync.Mutex
	records []T
}

// startReporter starts cmd, whose stdout and stderr it takes, and reads its
// records until it exits; the test's cleanup kills it, and logs its stderr
// if the test failed.
func startReporter[T any](t *testing.T, name string, cmd *exec.Cmd, readyLine string) *reporter[T] {
	t.Helper()
	r := &reporter[T]{stderr: newLockedWriter()}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = r.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready, done := make(chan struct{}), make(chan struct{})
	r.ready, r.done = ready, done
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if sc.Text() == readyLine {
				close(ready)
				continue
			}
			var rec T
			if err := json.Unmarshal(sc.Bytes(), &rec); err == nil {
				r.mu.Lock()
				r.records = append(r.records, rec)
				r.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s stderr: %s", name, r.Stderr())
		}
	})
	return r
}

// Records returns what the process reported so far.
func (r *reporter[T]) Records() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.records)
}

// Stderr returns what the process wrote to its stderr so far.
func (r *reporter[T]) Stderr() string { return r.stderr.String() }
