package testserver_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
)

// The browser the helper starts renders a page from a loopback server and
// runs its script, and runs with exactly the flags it promises.
func TestChromiumRendersPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, `<!doctype html><title>t</title><p id="p">static</p>
<script>document.getElementById("p").textContent = "scripted " + navigator.userAgent.includes("Headless");</script>`)
	}))
	t.Cleanup(srv.Close)
	browser := testserver.StartBrowser(t, 60*time.Second)
	if err := browser.Navigate(srv.URL); err != nil {
		t.Fatal(err)
	}
	text, err := browser.Text("#p")
	if err != nil {
		t.Fatal(err)
	}
	if text != "scripted true" {
		t.Fatalf("#p = %q, want the script's %q (a headless browser)", text, "scripted true")
	}

	// Debian's /usr/bin/chromium is a launcher that puts the defaults of
	// /etc/chromium.d first and the caller's flags after them, in order
	// (moving a page URL such as chromedp's about:blank ahead): the flags
	// from --user-data-dir on are the helper's.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(browser.PID()) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	i := slices.IndexFunc(argv, func(a string) bool { return strings.HasPrefix(a, "--user-data-dir=") })
	if i < 0 {
		t.Fatalf("chromium runs without --user-data-dir: %q", argv)
	}
	if dir := strings.TrimPrefix(argv[i], "--user-data-dir="); !strings.HasPrefix(dir, os.TempDir()) || !strings.Contains(dir, t.Name()) {
		t.Errorf("user data dir %s is not the test's own temporary directory", dir)
	}
	var want []string
	for _, f := range testserver.ChromiumFlags {
		want = append(want, "--"+f)
	}
	// chromedp's own: the pipe it talks over.
	want = append(want, "--remote-debugging-pipe")
	got := slices.DeleteFunc(slices.Clone(argv[i+1:]), func(a string) bool { return a == "about:blank" })
	if !slices.Equal(got, want) {
		t.Errorf("chromium runs with %q, want exactly %q", got, want)
	}
	if i > 1 {
		t.Logf("the launcher added %q", argv[1:i])
	}
}
