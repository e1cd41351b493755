package raftagent

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// ScreenshotDirEnv names a directory where the browser test also writes
// its screenshot, as status-page.png (docs/status-page.png comes from it).
const ScreenshotDirEnv = "BATON_SCREENSHOT_DIR"

// termAttrs are a term bar's data attributes, as the page has them.
type termAttrs struct {
	Lease  string `json:"lease"`
	Token  string `json:"token"`
	Holder string `json:"holder"`
	Label  string `json:"label"`
}

// termsJS lists the term bars of the page's timeline with their labels.
const termsJS = `[...document.querySelectorAll("svg.timeline g.bar")].map(g => {
	const r = g.querySelector("rect.term"), l = g.querySelector("text.label");
	return {lease: r.dataset.lease, token: r.dataset.token, holder: r.dataset.holder, label: l ? l.textContent : ""};
})`

// A real headless Chromium shows the status page of a real agent while a
// lease is handed over: the page refreshes itself, and its timeline ends
// up with both terms.
func TestBrowserStatusPageTimeline(t *testing.T) {
	browser := testserver.StartBrowser(t, 3*time.Minute) // skips (or fails) before the group starts
	g := newGroup(t, 3, nil)
	m0, m1, m2 := g.nodes[0], g.nodes[1], g.nodes[2]
	const token = "browser-test-token"
	agent := agentServer(t, m0, newHandler(t, m0, Options{Token: token}))

	// worker-a campaigns through the agent under test, as `baton run
	// --backend agent://` does; worker-b and worker-c are members of their
	// own elsewhere.
	client, err := raft.Dial(agent, raft.ClientOptions{Token: token, PlainTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	ttl := 3 * time.Second
	ba, bb, bc := backend(t, client, ttl), backend(t, m1, ttl), backend(t, m2, ttl)
	ta := testkit.Campaign(t, ba, "nightly-report", "worker-a")
	resignWhenAsked(t, ta, 0)
	testkit.Campaign(t, bc, "billing-sync", "worker-c")
	testkit.Campaign(t, ba, "cache-warmer", "worker-a")
	testkit.CampaignAsync(t, bc, "cache-warmer", "worker-c")
	handedOver := testkit.CampaignAsync(t, bb, "nightly-report", "worker-b")

	if err := browser.EmulateViewport(1200, 800); err != nil {
		t.Fatal(err)
	}
	// A one-minute window: the test's terms last seconds, and would be
	// slivers on the default hour.
	if err := browser.Navigate("http://" + agent + "/?window=1m"); err != nil {
		t.Fatal(err)
	}
	poll := func(what, js string) {
		t.Helper()
		if err := browser.Poll(js, 100*time.Millisecond, 90*time.Second); err != nil {
			t.Fatalf("waiting for the page to show %s: %v", what, err)
		}
	}
	// Until worker-a's term is long enough for its label, so that the
	// screenshot shows both terms labelled.
	poll("worker-a's term, labelled", `(`+termsJS+`).some(b => b.lease === "nightly-report" && b.label.startsWith("worker-a"))`)

	// The hand-over, while the page is open: an operator asks worker-a to
	// resign, and worker-b, queued on another member, takes over.
	req, err := http.NewRequest("POST", "http://"+agent+"/v1/leases/nightly-report/resign", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resign: %s, want 200", resp.Status)
	}
	tb := testkit.WaitTerm(t, handedOver, testkit.CampaignTimeout).Term

	poll("worker-b's term beside worker-a's, labelled", `(() => {
		const bars = (`+termsJS+`).filter(b => b.lease === "nightly-report");
		return new Set(bars.map(b => b.token)).size >= 2 && bars.some(b => b.label.startsWith("worker-b"));
	})()`)
	var bars []termAttrs
	if err := browser.Evaluate(termsJS, &bars); err != nil {
		t.Fatal(err)
	}
	var nightly []termAttrs
	for _, b := range bars {
		if b.Lease == "nightly-report" {
			nightly = append(nightly, b)
		}
	}
	want := []termAttrs{
		{Lease: "nightly-report", Holder: "worker-a", Token: strconv.FormatUint(ta.Token(), 10)},
		{Lease: "nightly-report", Holder: "worker-b", Token: strconv.FormatUint(tb.Token(), 10)},
	}
	if len(nightly) != 2 {
		t.Fatalf("nightly-report has %d term bars, want 2: %+v", len(nightly), nightly)
	}
	for i := range want {
		if nightly[i].Holder != want[i].Holder || nightly[i].Token != want[i].Token {
			t.Errorf("bar %d = %+v, want holder %s token %s", i, nightly[i], want[i].Holder, want[i].Token)
		}
	}
	if !slices.ContainsFunc(bars, func(b termAttrs) bool { return b.Lease == "billing-sync" && b.Holder == "worker-c" }) {
		t.Errorf("the timeline lacks billing-sync's term: %+v", bars)
	}
	// The page refreshed itself in place (the script), not by reloading.
	badge, err := browser.Text("#refresh")
	if err != nil {
		t.Fatal(err)
	}
	if want := "live · updated"; len(badge) < len(want) || badge[:len(want)] != want {
		t.Errorf("refresh badge %q, want %q...", badge, want)
	}

	// A full-page screenshot: the viewport grown to the page's height.
	var height int64
	if err := browser.Evaluate(`document.documentElement.scrollHeight`, &height); err != nil {
		t.Fatal(err)
	}
	if err := browser.EmulateViewport(1200, height); err != nil {
		t.Fatal(err)
	}
	png, err := browser.FullScreenshot(100)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "status-page.png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", file, len(png))
	if dir := os.Getenv(ScreenshotDirEnv); dir != "" {
		out := filepath.Join(dir, "status-page.png")
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(fmt.Errorf("%s: %w", ScreenshotDirEnv, err))
		}
		t.Logf("screenshot also written to %s", out)
	}
}
