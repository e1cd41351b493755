package statusapi

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/batonhq/baton/backend/raft"
)

// The timeline is an SVG drawn on the server: one row per lease, one bar per
// term, on a time axis of the last Options.History.

// Timeline geometry, in CSS pixels: the page is 1200 px wide.
const (
	svgWidth   = 1100
	labelWidth = 196 // lease names
	plotLeft   = labelWidth + 8
	plotRight  = svgWidth - 40 // room for the "now" label
	plotWidth  = plotRight - plotLeft
	axisHeight = 26
	rowHeight  = 30
	barHeight  = 20
	maxRows    = 200
	charWidth  = 6.6 // of the 11 px label font, generous
)

// palette are the holders' colours: distinct, and readable with the text
// colour textOn picks.
var palette = []string{
	"#4e79a7", // blue
	"#f28e2b", // orange
	"#59a14f", // green
	"#b07aa1", // purple
	"#76b7b2", // teal
	"#9c755f", // brown
	"#edc948", // yellow
	"#ff9da7", // pink
	"#5f6b7a", // slate
	"#8cd17d", // light green
	"#d37295", // rose
	"#499894", // dark teal
}

// textOn returns the label colour for a bar of colour c (#rrggbb).
func textOn(c string) string {
	r, _ := strconv.ParseUint(c[1:3], 16, 8)
	g, _ := strconv.ParseUint(c[3:5], 16, 8)
	b, _ := strconv.ParseUint(c[5:7], 16, 8)
	if 0.299*float64(r)+0.587*float64(g)+0.114*float64(b) > 160 {
		return "#1f2933"
	}
	return "#ffffff"
}

// colours gives each holder a colour: by a hash of its name, so that it
// keeps its colour across refreshes, and probing on to the next free one
// so that holders on one page differ while there are colours left.
func colours(holders []string) map[string]string {
	slices.Sort(holders)
	holders = slices.Compact(holders)
	out := make(map[string]string, len(holders))
	used := make([]bool, len(palette))
	for i, hd := range holders {
		f := fnv.New32a()
		f.Write([]byte(hd))
		k := int(f.Sum32() % uint32(len(palette)))
		if i < len(palette) {
			for used[k] {
				k = (k + 1) % len(palette)
			}
		}
		used[k] = true
		out[hd] = palette[k]
	}
	return out
}

// tlBar is one term's bar.
type tlBar struct {
	X, Y, W, H   float64
	CapX, LabelY float64 // the lost marker's x; the label's baseline
	Fill, Ink    string
	Lease        string
	Holder       string
	Token        uint64
	Label        string // empty when it does not fit
	LabelX       float64
	Title        string
	Running      bool
	Lost         bool
	StartUnknown bool
}

// tlRow is one lease's row.
type tlRow struct {
	Y, TextY float64
	Name     string
	Short    string // Name, shortened to fit the label column
	Even     bool
	Bars     []tlBar
	Empty    bool // no term in the window
}

// tlTick is a labelled time on the axis.
type tlTick struct {
	X     float64
	Label string
}

// legendItem is a holder's swatch.
type legendItem struct {
	Holder string
	Colour string
}

// timeline is the SVG's model.
type timeline struct {
	Width, Height        int
	PlotLeft, PlotRight  float64
	AxisY, RowsTop       float64
	RowsHeight, EmptyY   float64
	Rows                 []tlRow
	Ticks                []tlTick
	Unobserved           bool // the handler started within the window
	UnobservedW          float64
	Legend               []legendItem
	MoreHolders          int
	Hidden               int // leases beyond maxRows
	Untracked            int // leases not remembered (MaxLeases)
	From, To             string
	WindowLabel          string
	UnobservedSince      string
	Terms, Running, Lost int
}

// buildTimeline lays out the terms of [now-window, now]. table adds the
// running terms the history lacks (before its seed) and rows for leases
// with waiters but no term.
func buildTimeline(now time.Time, window time.Duration, started time.Time, hist map[string][]term, untracked int, table []raft.LeaseInfo) timeline {
	from := now.Add(-window)
	x := func(t time.Time) float64 {
		if t.Before(from) {
			t = from
		}
		if t.After(now) {
			t = now
		}
		return plotLeft + float64(t.Sub(from))/float64(window)*plotWidth
	}
	terms := make(map[string][]term, len(hist))
	maps.Copy(terms, hist)
	for _, in := range table {
		ts := terms[in.Name]
		if in.Holder != "" && !slices.ContainsFunc(ts, func(t term) bool { return t.Token == in.Token }) {
			start, known := in.Since, true
			if start.IsZero() {
				start, known = started, false
			}
			ts = append(slices.Clone(ts), term{Holder: in.Holder, Member: in.Member, Token: in.Token, Start: start, StartKnown: known})
			slices.SortFunc(ts, func(a, b term) int { return cmpUint(a.Token, b.Token) })
		}
		terms[in.Name] = ts
	}
	names := slices.Sorted(maps.Keys(terms))
	tl := timeline{
		Width: svgWidth, PlotLeft: plotLeft, PlotRight: plotRight, AxisY: axisHeight - 9, RowsTop: axisHeight,
		Untracked: untracked,
		From:      from.UTC().Format("15:04:05"), To: now.UTC().Format("15:04:05"),
		WindowLabel: shortDuration(window),
	}
	if len(names) > maxRows {
		tl.Hidden = len(names) - maxRows
		names = names[:maxRows]
	}
	var holders []string
	for _, n := range names {
		for _, t := range terms[n] {
			if t.ongoing() || t.End.After(from) {
				holders = append(holders, t.Holder)
			}
		}
	}
	col := colours(holders)
	for i, n := range names {
		y := float64(axisHeight + i*rowHeight)
		row := tlRow{Y: y, TextY: y + rowHeight/2 + 4, Name: n, Short: shorten(n, (labelWidth-12)*10/72), Even: i%2 == 0}
		for _, t := range terms[n] {
			end := t.End
			if t.ongoing() {
				end = now
			}
			if end.Before(from) {
				continue
			}
			x1, x2 := x(t.Start), x(end)
			b := tlBar{
				X: round1(x1), Y: y + (rowHeight-barHeight)/2, W: round1(max(x2-x1, 2)), H: barHeight,
				Fill: col[t.Holder], Lease: n, Holder: t.Holder, Token: t.Token,
				Running: t.ongoing(), Lost: t.Kind == raft.EventLost, StartUnknown: !t.StartKnown,
			}
			b.Ink = textOn(b.Fill)
			b.Title = termTitle(n, t, now)
			full, short := fmt.Sprintf("%s · #%d", t.Holder, t.Token), fmt.Sprintf("#%d", t.Token)
			switch room := b.W - 10; {
			case float64(len([]rune(full)))*charWidth <= room:
				b.Label = full
			case float64(len([]rune(short)))*charWidth <= room:
				b.Label = short
			}
			b.LabelX, b.LabelY, b.CapX = round1(b.X+5), b.Y+barHeight/2+4, round1(b.X+b.W-3)
			row.Bars = append(row.Bars, b)
			tl.Terms++
			if b.Running {
				tl.Running++
			}
			if b.Lost {
				tl.Lost++
			}
		}
		row.Empty = len(row.Bars) == 0
		tl.Rows = append(tl.Rows, row)
	}
	tl.Height = axisHeight + max(len(tl.Rows), 1)*rowHeight + 6
	tl.RowsHeight = float64(tl.Height - axisHeight)
	tl.EmptyY = axisHeight + rowHeight/2 + 4
	// Ticks on round wall-clock times, about eight of them.
	step, layout := tickStep(window), "15:04"
	if step < time.Minute {
		layout = "15:04:05"
	}
	for t := from.Truncate(step).Add(step); !t.After(now); t = t.Add(step) {
		// A tick too close to "now" would overprint its label.
		if x(now)-x(t) < 30 {
			break
		}
		tl.Ticks = append(tl.Ticks, tlTick{X: round1(x(t)), Label: t.UTC().Format(layout)})
	}
	if started.After(from) {
		tl.Unobserved, tl.UnobservedW = true, round1(x(started)-plotLeft)
		tl.UnobservedSince = started.UTC().Format("15:04:05")
	}
	hs := slices.Sorted(maps.Keys(col))
	for i, hd := range hs {
		if i == 12 {
			tl.MoreHolders = len(hs) - i
			break
		}
		tl.Legend = append(tl.Legend, legendItem{Holder: hd, Colour: col[hd]})
	}
	return tl
}

func tickStep(window time.Duration) time.Duration {
	for _, s := range []time.Duration{10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour} {
		if window/s <= 12 {
			return s
		}
	}
	return 24 * time.Hour
}

func termTitle(lease string, t term, now time.Time) string {
	start := t.Start.UTC().Format("15:04:05")
	if !t.StartKnown {
		start = "before " + start + " (not observed)"
	}
	s := fmt.Sprintf("%s: %s, token %d", lease, t.Holder, t.Token)
	if t.Member != "" {
		s += ", via member " + t.Member
	}
	if t.ongoing() {
		return s + fmt.Sprintf("\n%s → now (running %s)", start, durationLabel(now.Sub(t.Start)))
	}
	s += fmt.Sprintf("\n%s → %s (%s)", start, t.End.UTC().Format("15:04:05"), durationLabel(t.End.Sub(t.Start)))
	if t.Kind != "" {
		s += fmt.Sprintf(", %s", t.Kind)
		if t.Reason != "" {
			s += ": " + t.Reason
		}
	}
	return s
}

// durationLabel is a short human duration: 45s, 12m5s, 3h4m.
func durationLabel(d time.Duration) string {
	switch d = max(d, 0); {
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
