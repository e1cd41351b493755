package statusapi

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// clock is an injected clock that tests move by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)} }
func elected(lease, holder, member string, token uint64) raft.LeaseEvent {
	return raft.LeaseEvent{Lease: lease, Kind: raft.EventElected, Holder: holder, Session: "s-" + holder, Member: member, Token: token}
}
func endEv(kind raft.EventKind, lease, holder string, token uint64, reason string) raft.LeaseEvent {
	return raft.LeaseEvent{Lease: lease, Kind: kind, Holder: holder, Session: "s-" + holder, Token: token, Reason: reason}
}

func TestHistoryTermsAndBounds(t *testing.T) {
	c := newClock()
	m := NewMetrics()
	h := newHistory(memberIs("me"), time.Hour, 3, 2, m, c.now)

	h.apply(raft.LeaseEvent{Lease: "a", Kind: raft.EventQueued, Holder: "x", Session: "s-x"})
	c.add(time.Second)
	h.apply(elected("a", "x", "me", 10))
	c.add(time.Minute)
	h.apply(endEv(raft.EventReleased, "a", "x", 10, "resigned"))
	c.add(10 * time.Second) // a gap
	h.apply(elected("a", "y", "other", 12))

	snap, _ := h.snapshot()
	terms := snap["a"]
	if len(terms) != 2 {
		t.Fatalf("terms = %+v, want 2", terms)
	}
	if x := terms[0]; x.Holder != "x" || x.Token != 10 || x.End.Sub(x.Start) != time.Minute || x.Reason != "resigned" || x.Kind != raft.EventReleased {
		t.Errorf("first term = %+v", x)
	}
	if y := terms[1]; !y.ongoing() || y.Start.Sub(terms[0].End) != 10*time.Second {
		t.Errorf("second term = %+v, want running, 10 s after the first", y)
	}
	if v := testutil.ToFloat64(m.isLeader.WithLabelValues("a")); v != 0 {
		t.Errorf("is_leader = %v with y (via another member) holding, want 0", v)
	}
	if c := testutil.CollectAndCount(m.waitDuration); c != 1 {
		t.Errorf("campaign wait series = %d, want 1", c)
	}

	// At most 3 terms per lease: the oldest go.
	for tok := uint64(13); tok < 17; tok++ {
		h.apply(endEv(raft.EventLost, "a", "y", tok-1, "session-expired"))
		h.apply(elected("a", "y", "other", tok))
	}
	snap, _ = h.snapshot()
	if got := snap["a"]; len(got) != 3 || got[0].Token != 14 || got[2].Token != 16 {
		t.Errorf("tokens kept = %v, want 14..16", tokens(got))
	}

	// At most 2 leases: an idle one makes room, running ones do not.
	h.apply(elected("b", "x", "me", 20))
	h.apply(endEv(raft.EventReleased, "b", "x", 20, "resigned"))
	c.add(time.Second)
	h.apply(elected("c", "x", "me", 21)) // evicts b, which is idle
	snap, untracked := h.snapshot()
	if _, ok := snap["b"]; ok || untracked != 0 {
		t.Errorf("leases %v (untracked %d): want b forgotten", keys(snap), untracked)
	}
	h.apply(elected("d", "x", "me", 22)) // a and c run: d is not remembered
	snap, untracked = h.snapshot()
	if _, ok := snap["d"]; ok || untracked != 1 {
		t.Errorf("leases %v (untracked %d): want d not remembered", keys(snap), untracked)
	}

	// Terms that ended before the window are pruned; running ones stay.
	c.add(2 * time.Hour)
	snap, _ = h.snapshot()
	if got := snap["a"]; len(got) != 1 || got[0].Token != 16 {
		t.Errorf("after two hours a has %v, want the running term 16 only", tokens(got))
	}
}

// leaseSeries counts the series of lease across the per-lease metrics, in
// a scrape.
func leaseSeries(t *testing.T, m *Metrics, lease string) int {
	t.Helper()
	mfs, err := m.gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == "lease" && lp.GetValue() == lease {
					n++
				}
			}
		}
	}
	return n
}

// A lease the agent forgets takes its metric series along, at the next
// scrape after the window or when it makes room for another; a running
// lease keeps them.
func TestHistoryForgetsMetricSeries(t *testing.T) {
	c := newClock()
	m := NewMetrics()
	h := newHistory(memberIs("me"), time.Hour, 10, 3, m, c.now)
	// A scrape prunes before it gathers.
	if err := m.bind(stubSource{}, h.prune, time.Second, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	h.apply(raft.LeaseEvent{Lease: "old", Kind: raft.EventQueued, Holder: "x", Session: "s-x"})
	h.apply(elected("old", "x", "me", 1))
	c.add(time.Minute)
	h.apply(endEv(raft.EventReleased, "old", "x", 1, "resigned"))
	h.apply(elected("running", "y", "me", 2))
	if n := leaseSeries(t, m, "old"); n != 6 {
		t.Fatalf("old has %d series, want 6 (is_leader; queued, elected and released; term duration; campaign wait)", n)
	}
	c.add(time.Hour) // the end is exactly a window old: kept
	if n := leaseSeries(t, m, "old"); n == 0 {
		t.Fatal("old's series went within the window")
	}
	c.add(time.Second)
	if n := leaseSeries(t, m, "old"); n != 0 {
		t.Errorf("old still has %d series after the window", n)
	}
	if n := leaseSeries(t, m, "running"); n == 0 {
		t.Error("running lost its series")
	}

	// Making room: with 3 leases remembered, a new one evicts the idle one.
	h.apply(elected("idle", "z", "other", 3))
	h.apply(endEv(raft.EventLost, "idle", "z", 3, "session-expired"))
	h.apply(elected("third", "z", "other", 4))
	h.apply(elected("fourth", "z", "other", 5))
	if n := leaseSeries(t, m, "idle"); n != 0 {
		t.Errorf("idle, evicted, still has %d series", n)
	}
	if n := leaseSeries(t, m, "fourth"); n == 0 {
		t.Error("fourth has no series")
	}
}

// stubSource is a lease table with nothing in it.
type stubSource struct{ Source }

func (stubSource) Leases(context.Context) ([]raft.LeaseInfo, error) { return nil, nil }
func (stubSource) ID() string                                       { return "me" }

// Terms that began before the agent watched: the lease table's Since, read
// after subscribing, fills in their start.
func TestHistorySeed(t *testing.T) {
	c := newClock()
	h := newHistory(memberIs("me"), time.Hour, 10, 10, NewMetrics(), c.now)
	since := c.t.Add(-5 * time.Minute)
	c.add(time.Second)
	// An end seen before the table read: its start is unknown until then.
	h.apply(endEv(raft.EventReleased, "a", "x", 5, "resigned"))
	h.apply(elected("a", "y", "me", 7))
	h.seed([]raft.LeaseInfo{
		{Name: "a", Holder: "y", Token: 7, Since: since, Member: "me"}, // known from the event: unchanged
		{Name: "b", Holder: "z", Token: 3, Since: since, Member: "other"},
		{Name: "c", Waiters: 2}, // free: nothing to draw
	})
	snap, _ := h.snapshot()
	if a := snap["a"]; len(a) != 2 || a[0].StartKnown || !a[0].Start.Equal(h.started) || a[1].Start.Equal(since) {
		t.Errorf("a = %+v: want the ended term from the agent's start (unknown), the running one from its event", a)
	}
	if b := snap["b"]; len(b) != 1 || !b[0].Start.Equal(since) || !b[0].StartKnown || !b[0].ongoing() {
		t.Errorf("b = %+v, want a running term since %s", b, since)
	}
	if _, ok := snap["c"]; ok {
		t.Errorf("c, free, has a history")
	}
	// A table older than the events already applied adds no running
	// term, but tells when the ended one began.
	h.seed([]raft.LeaseInfo{{Name: "a", Holder: "x", Token: 5, Since: since}})
	snap, _ = h.snapshot()
	if a := snap["a"]; len(a) != 2 || a[0].ongoing() || !a[0].StartKnown || !a[0].Start.Equal(since) || !a[1].ongoing() {
		t.Errorf("a = %+v after an older table", a)
	}
}

func TestHistoryAwaitEnd(t *testing.T) {
	c := newClock()
	h := newHistory(memberIs("me"), time.Hour, 10, 10, NewMetrics(), c.now)
	h.apply(elected("a", "x", "me", 5))
	done, forget := h.awaitEnd("a", 5)
	defer forget()
	select {
	case e := <-done:
		t.Fatalf("ended %+v before the end", e)
	default:
	}
	h.apply(endEv(raft.EventReleased, "a", "x", 5, "resign-requested"))
	if e := <-done; e.Token != 5 || e.Reason != "resign-requested" || e.Holder != "x" {
		t.Errorf("ended = %+v", e)
	}
	// An end already seen answers at once.
	done2, forget2 := h.awaitEnd("a", 5)
	defer forget2()
	if e := <-done2; e.Token != 5 {
		t.Errorf("ended = %+v", e)
	}
}

func TestTimelineLayout(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 0, 0, 0, time.UTC)
	started := now.Add(-50 * time.Minute)
	hist := map[string][]term{
		"job": {
			{Holder: "alpha", Token: 4, Start: now.Add(-40 * time.Minute), StartKnown: true, End: now.Add(-30 * time.Minute), Kind: raft.EventReleased, Reason: "resigned"},
			{Holder: "beta", Token: 9, Start: now.Add(-20 * time.Minute), StartKnown: true, End: now.Add(-10 * time.Minute), Kind: raft.EventLost, Reason: "session-expired"},
			{Holder: "alpha", Token: 11, Start: now.Add(-5 * time.Minute), StartKnown: true},
			{Holder: "gamma", Token: 2, Start: now.Add(-3 * time.Hour), StartKnown: true, End: now.Add(-2 * time.Hour)}, // before the window
		},
	}
	table := []raft.LeaseInfo{{Name: "other", Holder: "delta", Token: 3, Since: now.Add(-2 * time.Hour)}, {Name: "queue-only", Waiters: 1}}
	tl := buildTimeline(now, time.Hour, started, hist, 0, table)
	if len(tl.Rows) != 3 || tl.Rows[0].Name != "job" || tl.Rows[1].Name != "other" || !tl.Rows[2].Empty {
		t.Fatalf("rows = %+v", tl.Rows)
	}
	bars := tl.Rows[0].Bars
	if len(bars) != 3 {
		t.Fatalf("job bars = %+v, want 3 (gamma's term is before the window)", bars)
	}
	px := float64(plotWidth) / 60 // per minute
	if a := bars[0]; a.X != round1(plotLeft+20*px) || a.W != round1(10*px) || a.Running || a.Lost {
		t.Errorf("alpha's first bar = %+v", a)
	}
	if b := bars[1]; !b.Lost || b.X-(bars[0].X+bars[0].W) < 9*px {
		t.Errorf("beta's bar = %+v: want lost, after a 10-minute gap", b)
	}
	if a := bars[2]; !a.Running || a.X+a.W != round1(plotRight) {
		t.Errorf("alpha's running bar = %+v, want it to reach now", a)
	}
	if bars[0].Fill != bars[2].Fill || bars[0].Fill == bars[1].Fill {
		t.Errorf("colours %s %s %s: want one per holder", bars[0].Fill, bars[1].Fill, bars[2].Fill)
	}
	if bars[0].Label != "alpha · #4" {
		t.Errorf("label %q", bars[0].Label)
	}
	// A term from the table the history lacks starts at its Since (clipped).
	if o := tl.Rows[1].Bars; len(o) != 1 || o[0].X != plotLeft || !o[0].Running || o[0].Holder != "delta" {
		t.Errorf("other's bars = %+v", o)
	}
	if !tl.Unobserved || tl.UnobservedW != round1(10*px) {
		t.Errorf("unobserved = %v %v, want the first 10 minutes", tl.Unobserved, tl.UnobservedW)
	}
	if len(tl.Ticks) != 11 || tl.Ticks[0].Label != "14:05" {
		t.Errorf("ticks = %+v, want 14:05 to 14:55 every 5 minutes", tl.Ticks)
	}
	if len(tl.Legend) != 3 {
		t.Errorf("legend = %+v, want alpha, beta, delta", tl.Legend)
	}
}

func TestColoursDistinct(t *testing.T) {
	var hs []string
	for i := range len(palette) {
		hs = append(hs, string(rune('a'+i)))
	}
	seen := map[string]bool{}
	for _, c := range colours(hs) {
		if seen[c] {
			t.Fatalf("colour %s given twice among %d holders", c, len(hs))
		}
		seen[c] = true
	}
	// A holder keeps its colour from page to page while it has no
	// collision.
	if a, b := colours([]string{"worker-a"})["worker-a"], colours([]string{"worker-a", "worker-b"})["worker-a"]; a != b {
		t.Errorf("worker-a's colour changed with another holder on the page: %s, %s", a, b)
	}
}

func tokens(ts []term) []uint64 {
	var out []uint64
	for _, t := range ts {
		out = append(out, t.Token)
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// memberIs is the "held here" of a member whose ID is id.
func memberIs(id string) func(holder, member string) bool {
	return func(holder, member string) bool { return holder != "" && member == id }
}
