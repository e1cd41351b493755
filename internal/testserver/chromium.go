package testserver

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// ChromiumPath is where Debian's chromium package installs the browser;
// ChromiumBinary falls back to "chromium" on PATH.
const ChromiumPath = "/usr/bin/chromium"

// ErrChromiumMissing is wrapped by ChromiumBinary's error when no chromium
// is installed.
var ErrChromiumMissing = errors.New("chromium is not installed")

// chromiumHint says how to get the browser that browser tests drive.
const chromiumHint = "browser tests drive a headless Chromium through chromedp: apt-get install chromium " +
	"(Debian's package, /usr/bin/chromium)"

// ChromiumFlags are the command-line flags ChromiumAllocator starts the
// browser with, besides the fresh --user-data-dir (and the
// --remote-debugging-pipe over which chromedp talks to it, so that the
// browser listens on no port): headless,
// without the sandbox (tests run as root in containers), and with every
// background service that would reach the network or the disk switched off.
var ChromiumFlags = []string{
	"headless",
	"no-sandbox",
	"disable-gpu",
	"disable-background-networking",
	"no-first-run",
	"disable-quic",
	"disable-component-update",
	"disable-sync",
}

// ChromiumBinary returns the path of the chromium binary: ChromiumPath, or
// "chromium" on PATH; an error wrapping ErrChromiumMissing when neither
// exists.
func ChromiumBinary() (string, error) {
	if p, err := exec.LookPath(ChromiumPath); err == nil {
		return p, nil
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		return "", fmt.Errorf("%w: neither %s nor chromium on PATH: %v", ErrChromiumMissing, ChromiumPath, err)
	}
	return p, nil
}

// ChromiumAllocator returns a chromedp allocator context that starts a
// headless Chromium with exactly ChromiumFlags and a fresh user-data dir
// in t.TempDir(), so that no profile, cache or cookie survives a test.
// Derive browser contexts from it with chromedp.NewContext; the browser
// starts on the first chromedp.Run, and is killed (and waited for) when the
// test ends, its output shown if the test failed. A missing chromium skips
// the test, or fails it under BATON_REQUIRE_SERVERS=1, saying to
// apt-get install chromium.
//
// Debian's /usr/bin/chromium is a launcher script that puts the distro's
// defaults from /etc/chromium.d (--disable-pings, --no-default-browser-check
// and the like) before these flags; the helper adds nothing else.
func ChromiumAllocator(t testing.TB) context.Context {
	t.Helper()
	bin, err := ChromiumBinary()
	if err != nil {
		// Not Unavailable: its generic hint speaks of servers on
		// 127.0.0.1, and a browser is neither.
		if RequireServers() {
			t.Fatalf("chromium unavailable: %v\n%s\n(failing rather than skipping because %s=1)",
				err, chromiumHint, RequireServersEnv)
		}
		t.Skipf("chromium unavailable: %v\n%s\n(set %s=1 to fail instead of skip)",
			err, chromiumHint, RequireServersEnv)
	}
	out := &SyncBuffer{}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.CombinedOutput(out),
	}
	for _, f := range ChromiumFlags {
		opts = append(opts, chromedp.Flag(f, true))
	}
	ctx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(func() {
		if t.Failed() && out.Len() > 0 {
			t.Logf("chromium output:\n%s", out)
		}
	})
	// Registered after the log, so it runs first: cancelling the allocator
	// kills the browser and waits for it, and its output is complete.
	t.Cleanup(cancel)
	return ctx
}
