package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// TestRunStandbyReportsLeader: a standby logs who leads ("standing by")
// from the backend's watch, and again when that changes: b and c stand by
// behind a; when a stops, one of them takes over and the other reports it.
func TestRunStandbyReportsLeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) string
		ttl     string
	}{
		{"etcd", func(t *testing.T) string { return etcdURL(t) }, "2s"},
		{"zookeeper", func(t *testing.T) string { return zkURL(t, "/services/standby") }, "4s"},
		{"consul", func(t *testing.T) string { return consulURL(t, "/services") }, "4s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			backend := tc.backend(t)
			start := func(id string) *batonProc {
				return startBaton(t, id, testEnv(), "run", "--backend", backend, "--lease", "standby", "--id", id,
					"--ttl", tc.ttl, "--", "sleep", "600")
			}
			standingBy := func(p *batonProc, from int, leader string) {
				t.Helper()
				testkit.Eventually(t, 30*time.Second, p.name+" standing by behind "+leader, func() bool {
					for _, l := range strings.Split(p.out.String()[from:], "\n") {
						if strings.Contains(l, `msg="standing by"`) && strings.Contains(l, `leader="`+leader+` (token `) {
							return true
						}
					}
					return false
				})
			}
			a := start("a")
			testkit.Eventually(t, 30*time.Second, "a elected", func() bool { return strings.Contains(a.out.String(), "elected") })
			b := start("b")
			standingBy(b, 0, "a")
			c := start("c")
			standingBy(c, 0, "a")
			fromB, fromC := len(b.out.String()), len(c.out.String())
			if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			a.wait(t, 30*time.Second)
			// b or c takes over (Consul has no queue), and the other
			// reports it.
			var next, other *batonProc
			testkit.Eventually(t, 30*time.Second, "b or c elected", func() bool {
				switch {
				case strings.Contains(b.out.String()[fromB:], "msg=elected"):
					next, other = b, c
				case strings.Contains(c.out.String()[fromC:], "msg=elected"):
					next, other = c, b
				}
				return next != nil
			})
			from := fromB
			if other == c {
				from = fromC
			}
			standingBy(other, from, next.name)
		})
	}
}
