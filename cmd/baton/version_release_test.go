package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersionReleaseCommit: a binary built by go install from module zips
// has a version but no VCS settings; the commit tools/release stamps in
// fills them, and never overrides a commit the build recorded itself.
func TestVersionReleaseCommit(t *testing.T) {
	t.Parallel()
	fromZip := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.2"}}
	got := versionText(withReleaseCommit(fromZip, "0123abcd", "2026-01-02T03:04:05Z"), true)
	for _, w := range []string{"baton v1.4.2\n", "commit: 0123abcd (2026-01-02T03:04:05Z)\n"} {
		if !strings.Contains(got, w) {
			t.Errorf("stamped release: %q lacks %q", got, w)
		}
	}
	if len(fromZip.Settings) != 0 {
		t.Errorf("withReleaseCommit changed its argument: %v", fromZip.Settings)
	}
	if got := versionText(withReleaseCommit(fromZip, "", ""), true); !strings.Contains(got, "commit: unknown") {
		t.Errorf("unstamped: %q", got)
	}
	fromVCS := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "feedface"}}}
	if got := versionText(withReleaseCommit(fromVCS, "0123abcd", ""), true); !strings.Contains(got, "commit: feedface") {
		t.Errorf("a build with its own commit: %q", got)
	}
}
