package check

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/chaos/internal/record"
)

// wellFormed decodes svg as XML to its end.
func wellFormed(t *testing.T, svg []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
	}
}

func render(t *testing.T, h record.History, opts SVGOptions) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteSVG(&buf, h, Check(h), opts); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, buf.Bytes())
	return buf.Bytes()
}

// TestSVGMarksViolations draws a history with an unexplained overlap, a
// fencing violation, refused writes and a fault, with text that needs
// escaping.
func TestSVGMarksViolations(t *testing.T) {
	b := newBuilder().
		child("c1", 101, 10, 0, 2*time.Second).
		child("c2", 201, 20, time.Second, 3*time.Second).
		fault("stop<tree>", "c1", 500*ms, 700*ms, false)
	b.run.Command = `baton-chaos --backend etcd --note "a<b & c>d"`
	b.faults[0].Note = `latency "50ms" & <more>`
	h := b.build()
	h.Writes[len(h.Writes)-1].Accepted = false
	late := record.Write{At: 3100 * ms, Candidate: "c1", Token: 10, PID: 101, Seq: 999, Accepted: true}
	h.Writes = append(h.Writes, late)
	svg := string(render(t, h, SVGOptions{}))
	for _, want := range []string{
		"unexplained overlap 1s to 3s (2s)",
		"fencing violation at 3.1s: c1 token 10 pid 101 accepted after token 20",
		"fault 1 stop&lt;tree&gt; → c1",
		"latency &#34;50ms&#34; &amp; &lt;more&gt;",
		"a&lt;b &amp; c&gt;d",
		"stale writes refused",
		"c1 token 10 pid 101: 0s to 3.1s",
		"FAIL: ",
		">2s</text>", // an axis label
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestSVGPassingRun(t *testing.T) {
	svg := string(render(t, handOver().fault("kill", "c1", time.Second, time.Second, false).build(), SVGOptions{}))
	if !strings.Contains(svg, "· PASS<") || strings.Contains(svg, "<title>unexplained overlap") {
		t.Error("a passing run is not drawn as passing")
	}
	if !strings.Contains(svg, "fault: kill") {
		t.Error("legend lacks the fault kind")
	}
}

// longRun is an hour of 20 ms heartbeats: 1000 terms among three
// candidates, each ended by a fault, with a few stale writes after each.
func longRun() record.History {
	b := newBuilder()
	const terms = 1000
	termLen := time.Hour / terms
	for i := range terms {
		cand := fmt.Sprintf("c%d", i%3+1)
		start := time.Duration(i) * termLen
		end := start + termLen - 300*ms
		b.child(cand, 1000+i, uint64(100+i), start, end)
		if i > 0 {
			// the previous holder's child, paused, writes late twice.
			prev := fmt.Sprintf("c%d", (i-1)%3+1)
			b.write(prev, 1000+i-1, uint64(100+i-1), start+40*ms)
			b.write(prev, 1000+i-1, uint64(100+i-1), start+60*ms)
			b.fault("stop-tree", prev, start-300*ms, start+20*ms, true)
		}
	}
	return b.build()
}

func TestSVGBoundedForLongRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an hour of writes")
	}
	h := longRun()
	if len(h.Writes) < 160_000 {
		t.Fatalf("only %d writes", len(h.Writes))
	}
	r := Check(h)
	if !r.OK() || r.Overlaps.Paused != 999 || r.Fencing.StaleRefused != 1998 {
		t.Fatalf("long run: %q, paused overlaps %d, stale %d", r.Failures(), r.Overlaps.Paused, r.Fencing.StaleRefused)
	}
	whole := render(t, h, SVGOptions{})
	const limit = 4 << 20
	if len(whole) > limit {
		t.Errorf("SVG of an hour is %d bytes; want at most %d", len(whole), limit)
	}
	if !strings.Contains(string(whole), `width="20110"`) {
		t.Errorf("an hour is not drawn at the maximum width")
	}
	detail := render(t, h, SVGOptions{To: time.Minute})
	if len(detail) >= len(whole)/10 {
		t.Errorf("the first minute is %d bytes, the hour %d: the window does not cut", len(detail), len(whole))
	}
	if !strings.Contains(string(detail), ">1m0s</text>") {
		t.Error("the detail's axis does not reach 1m0s")
	}
	t.Logf("hour: %d writes, SVG %d bytes; first minute %d bytes", len(h.Writes), len(whole), len(detail))
}
