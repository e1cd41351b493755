package testserver

import (
	"os"
	"sync"
	"testing"
)

// sharedServer is one server of a kind shared by every test of a test
// binary: started on first use in a directory of its own, and stopped by
// the package's TestMain.
type sharedServer[S interface{ Close() }] struct {
	mu      sync.Mutex
	srv     S
	running bool
	dir     string
	err     error // why it could not start; kept, so later tests fail alike
}

// get returns the server, starting it with start on first use. A start
// error for which unavailable returns a reason goes through Unavailable
// (skip, or fail under BATON_REQUIRE_SERVERS=1); any other fails the test.
func (s *sharedServer[S]) get(t testing.TB, kind string, start func(dir string) (S, error), unavailable func(error) error) S {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running && s.err == nil {
		dir, err := os.MkdirTemp("", "baton-"+kind+"-")
		if err == nil {
			s.dir = dir
			s.srv, err = start(dir)
		}
		s.err = err
		s.running = err == nil
	}
	if s.err != nil {
		if why := unavailable(s.err); why != nil {
			Unavailable(t, kind, why)
		}
		t.Fatalf("start shared %s: %v", kind, s.err)
	}
	return s.srv
}

// stop stops the server, if it runs, and removes its directory.
func (s *sharedServer[S]) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		s.srv.Close()
		var zero S
		s.srv, s.running = zero, false
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
		s.dir = ""
	}
	s.err = nil
}
