package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// idleIgnored is the SigIgn mask baton idle sets: SIGHUP, SIGQUIT,
// SIGUSR1 and SIGUSR2.
const idleIgnored = 1<<(syscall.SIGHUP-1) | 1<<(syscall.SIGQUIT-1) | 1<<(syscall.SIGUSR1-1) | 1<<(syscall.SIGUSR2-1)

// idleReady reports whether pid ignores the signals baton idle ignores,
// which it does once it waits.
func idleReady(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && mask&idleIgnored == idleIgnored
		}
	}
	return false
}

// TestIdle runs baton idle as a process: the signals baton run forwards
// to its command (SIGHUP, SIGUSR1, SIGUSR2, SIGWINCH, SIGQUIT) do not end
// it, SIGTERM and SIGINT end it with status 0. Without the signals
// ignored, SIGHUP kills it (status "signal: hangup"), and a sidecar whose
// baton got a SIGHUP would resign.
func TestIdle(t *testing.T) {
	t.Parallel()
	for _, stop := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(stop.String(), func(t *testing.T) {
			t.Parallel()
			p := startBaton(t, "idle", testEnv(), "idle")
			testkit.Eventually(t, time.Minute, "baton idle to ignore the forwarded signals (SigIgn)", func() bool { return idleReady(p.cmd.Process.Pid) })
			for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGQUIT, stop} {
				if err := p.cmd.Process.Signal(sig); err != nil {
					t.Fatalf("%v: %v", sig, err)
				}
			}
			if code := p.wait(t, time.Minute); code != 0 {
				t.Fatalf("baton idle: %v after the forwarded signals and %v, want exit status 0\n%s", p.cmd.ProcessState, stop, p.out)
			}
			if p.out.Len() != 0 {
				t.Errorf("baton idle wrote %q, want nothing", p.out)
			}
		})
	}
	t.Run("argument", func(t *testing.T) {
		t.Parallel()
		r := runBaton(t, time.Minute, "idle", "infinity")
		if r.code != exitUsage || !strings.Contains(r.stderr, `unexpected argument "infinity"`) {
			t.Errorf("baton idle infinity: status %d, stderr %q; want 2 naming the argument", r.code, r.stderr)
		}
	})
}

// TestRunIdle runs baton run with baton idle as its command, in an
// environment without PATH (as in the release image, where baton is the
// only program): baton idle lasts the term, and at SIGTERM baton stops
// it, resigns and exits 0, leaving no idle process behind.
func TestRunIdle(t *testing.T) {
	t.Parallel()
	p := startBaton(t, "run", []string{"HOME=" + t.TempDir()},
		"run", "--backend", "memory://", "--lease", "idle", "--grace", "2s", "--", batonBin, "idle")
	var idle int
	testkit.Eventually(t, time.Minute, "baton idle to run under baton run's guard, ready", func() bool {
		idle = idleChild(p.cmd.Process.Pid)
		return idle != 0 && idleReady(idle)
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, time.Minute); code != 0 {
		t.Fatalf("baton run exited %d on SIGTERM, want 0\n%s", code, p.out)
	}
	if alive(idle) {
		t.Errorf("baton idle (pid %d) outlived baton run", idle)
	}
}

// idleChild returns the pid of a baton idle process that descends from
// pid (through the guard), 0 if there is none.
func idleChild(pid int) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child))
		if err != nil || !bytes.Equal(cmdline, []byte(batonBin+"\x00idle\x00")) {
			continue
		}
		for anc, n := child, 0; n < 3; n++ {
			_, ppid, ok := procStat(anc)
			if !ok {
				break
			}
			if ppid == pid {
				return child
			}
			anc = ppid
		}
	}
	return 0
}
