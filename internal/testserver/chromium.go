package testserver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
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

// ChromiumFlags are the command-line flags StartBrowser starts the
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

// ChromedpTool is the program through which the tests drive Chromium with
// chromedp, built from tools/chromedp, so that the main module does not
// depend on chromedp.
var ChromedpTool = Tool{
	Name:    "chromedp-driver",
	Module:  "github.com/chromedp/chromedp",
	Version: "v0.23.0",
	Package: "github.com/batonhq/baton/tools/chromedp",
	Dir:     "tools/chromedp",
}

// Browser is a headless Chromium driven by chromedp in a helper process
// (ChromedpTool). Its methods run one step each, in order, on the browser's
// one tab; they are safe for concurrent use but serialised.
type Browser struct {
	mu     sync.Mutex
	pid    int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	answer *bufio.Scanner
	out    *SyncBuffer
	exited chan struct{}
}

// StartBrowser starts a headless Chromium with exactly ChromiumFlags and a
// fresh user-data dir in t.TempDir(), so that no profile, cache or cookie
// survives a test. The browser may run for timeout; it is killed (and
// waited for) when the test ends, its output shown if the test failed. A
// missing chromium, or a driver that cannot be built, skips the test, or
// fails it under BATON_REQUIRE_SERVERS=1, saying how to get it.
//
// Debian's /usr/bin/chromium is a launcher script that puts the distro's
// defaults from /etc/chromium.d (--disable-pings, --no-default-browser-check
// and the like) before these flags; the helper adds nothing else.
func StartBrowser(t testing.TB, timeout time.Duration) *Browser {
	t.Helper()
	bin, err := ChromiumBinary()
	if err == nil {
		var driver string
		if driver, err = ChromedpTool.Binary(); err != nil {
			err = fmt.Errorf("%w\n%s", err, ChromedpTool.Hint())
		} else {
			return startBrowser(t, driver, bin, timeout)
		}
	}
	// Not Unavailable: its generic hint speaks of servers on 127.0.0.1,
	// and a browser is neither.
	if RequireServers() {
		t.Fatalf("chromium unavailable: %v\n%s\n(failing rather than skipping because %s=1)",
			err, chromiumHint, RequireServersEnv)
	}
	t.Skipf("chromium unavailable: %v\n%s\n(set %s=1 to fail instead of skip)",
		err, chromiumHint, RequireServersEnv)
	return nil
}

func startBrowser(t testing.TB, driver, bin string, timeout time.Duration) *Browser {
	t.Helper()
	args := []string{"-chromium=" + bin, "-user-data-dir=" + t.TempDir(), "-timeout=" + timeout.String()}
	for _, f := range ChromiumFlags {
		args = append(args, "-flag="+f)
	}
	b := &Browser{out: new(SyncBuffer), exited: make(chan struct{})}
	b.cmd = exec.Command(driver, args...)
	b.cmd.Stderr = b.out
	// Should the test binary die without its clean-up, the kernel kills the
	// driver, and chromedp has the kernel kill the browser with it.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	if b.stdin, err = b.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b.answer = bufio.NewScanner(stdout)
	b.answer.Buffer(nil, 256<<20) // a screenshot, base64-encoded
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", driver, err)
	}
	go func() {
		_ = b.cmd.Wait()
		close(b.exited)
	}()
	t.Cleanup(func() {
		if t.Failed() && b.out.Len() > 0 {
			t.Logf("chromium output:\n%s", b.out)
		}
	})
	// Registered after the log, so it runs first: the driver kills the
	// browser and waits for it when its stdin ends, so the output is
	// complete.
	t.Cleanup(b.close)
	if err := b.read(&b.pid); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

func (b *Browser) close() {
	_ = b.stdin.Close()
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

// read decodes the driver's next answer into v (if v is not nil).
func (b *Browser) read(v any) error {
	if !b.answer.Scan() {
		if err := b.answer.Err(); err != nil {
			return err
		}
		return errors.New("the chromedp driver exited")
	}
	var resp struct {
		Err   string          `json:"err"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(b.answer.Bytes(), &resp); err != nil {
		return fmt.Errorf("the chromedp driver answered %q: %w", b.answer.Bytes(), err)
	}
	if resp.Err != "" {
		return errors.New(resp.Err)
	}
	if v == nil || len(resp.Value) == 0 {
		return nil
	}
	return json.Unmarshal(resp.Value, v)
}

// do sends one step and decodes its answer into v.
func (b *Browser) do(req map[string]any, v any) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	line, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := b.stdin.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("the chromedp driver: %w", err)
	}
	return b.read(v)
}

// PID returns the browser's process ID.
func (b *Browser) PID() int { return b.pid }

// Navigate loads url in the tab and waits for it to load (chromedp.Navigate).
func (b *Browser) Navigate(url string) error {
	return b.do(map[string]any{"op": "navigate", "url": url}, nil)
}

// EmulateViewport sets the tab's viewport (chromedp.EmulateViewport).
func (b *Browser) EmulateViewport(width, height int64) error {
	return b.do(map[string]any{"op": "viewport", "width": width, "height": height}, nil)
}

// Poll evaluates the script js every interval until it is true, and fails
// after timeout (chromedp.Poll).
func (b *Browser) Poll(js string, interval, timeout time.Duration) error {
	return b.do(map[string]any{"op": "poll", "js": js,
		"interval_ms": interval.Milliseconds(), "timeout_ms": timeout.Milliseconds()}, nil)
}

// Evaluate evaluates the script js and decodes its value into v
// (chromedp.Evaluate).
func (b *Browser) Evaluate(js string, v any) error {
	return b.do(map[string]any{"op": "eval", "js": js}, v)
}

// Text returns the visible text of the first element that the CSS
// selector css matches (chromedp.Text).
func (b *Browser) Text(css string) (string, error) {
	var s string
	err := b.do(map[string]any{"op": "text", "css": css}, &s)
	return s, err
}

// FullScreenshot returns an image of the whole page: a PNG at quality 100,
// a JPEG of that quality below it (chromedp.FullScreenshot).
func (b *Browser) FullScreenshot(quality int) ([]byte, error) {
	var png []byte
	err := b.do(map[string]any{"op": "screenshot", "quality": quality}, &png)
	return png, err
}
