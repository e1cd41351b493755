package testserver_test

import (
	"errors"
	"runtime"
	"testing"

	"github.com/batonhq/baton/internal/testserver"
)

func TestUnavailableSkipsUnlessRequired(t *testing.T) {
	for _, tc := range []struct {
		env        string
		wantFailed bool
	}{{"", false}, {"0", false}, {"1", true}} {
		t.Run("BATON_REQUIRE_SERVERS="+tc.env, func(t *testing.T) {
			t.Setenv(testserver.RequireServersEnv, tc.env)
			if got := testserver.RequireServers(); got != tc.wantFailed {
				t.Errorf("RequireServers() = %v, want %v", got, tc.wantFailed)
			}
			rec := &recorder{TB: t}
			ran := make(chan struct{})
			// Skipf and Fatalf end the goroutine that calls them.
			go func() {
				defer close(ran)
				testserver.Unavailable(rec, "etcd", errors.New("connection refused"))
			}()
			<-ran
			if rec.failed != tc.wantFailed || rec.skipped == tc.wantFailed {
				t.Errorf("failed=%v skipped=%v, want failed=%v", rec.failed, rec.skipped, tc.wantFailed)
			}
		})
	}
}

// recorder notes how Unavailable ended a test without ending the real one.
type recorder struct {
	testing.TB
	failed, skipped bool
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = true
	runtime.Goexit()
}
