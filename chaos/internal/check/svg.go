package check

import (
	"cmp"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/batonhq/baton/chaos/internal/record"
)

// DefaultMaxWidth bounds the plot's width in pixels when SVGOptions.MaxWidth
// is zero: wide enough for an hour at 5 px a second, small enough for a
// browser.
const DefaultMaxWidth = 20000

// SVGOptions selects what WriteSVG draws. The zero value draws the whole run.
type SVGOptions struct {
	// From and To bound the window drawn, on the run's clock; To zero means
	// the end of the run.
	From, To time.Duration
	// Width is the plot's width in pixels; zero means 1 px per 100 ms of
	// the window, at least 800 and at most MaxWidth.
	Width int
	// MaxWidth caps an automatic Width; zero means DefaultMaxWidth.
	MaxWidth int
}

// Layout, in pixels.
const (
	svgLeft     = 90 // row labels
	svgRight    = 20
	svgHeader   = 56 // title lines
	svgMarkers  = 18 // lane of violation markers
	svgRow      = 30
	svgBar      = 14
	svgAxis     = 34
	svgLegendLn = 18
	legendItem  = 300
)

// Colours: terms alternate between two blues; faults take one colour per
// kind, in the order of the kinds' names.
var (
	termColours  = [2]string{"#3b6fc4", "#7fb0ef"}
	faultColours = []string{"#f2c14e", "#9b7fd1", "#5fb87a", "#e58b4d", "#58b7c9", "#d17fb3", "#a6a05a", "#8c8c8c", "#c9a27e", "#6d8fd6"}
)

const (
	colourStale   = "#d62728"
	colourBad     = "#d62728"
	colourPaused  = "#ff9f1c"
	colourRecover = "#999999"
)

// WriteSVG draws h as a timeline: one row per candidate with bars where its
// children wrote (term colours alternate; a thin line where a child was
// alive but silent), refused writes as red ticks, faults as bands behind
// (with their recovery window lighter), overlaps and fencing violations in
// red with markers above, and a time axis. r is h's report, from Check.
// Writes are merged into pixel-wide intervals first, so the size is bounded
// by the width, the rows and the faults, not by the number of writes.
func WriteSVG(w io.Writer, h record.History, r Report, opts SVGOptions) error {
	x := index(h)
	from, to := opts.From, opts.To
	if to <= 0 {
		to = x.duration
	}
	if to <= from {
		to = from + time.Second
	}
	maxW := opts.MaxWidth
	if maxW <= 0 {
		maxW = DefaultMaxWidth
	}
	plotW := opts.Width
	if plotW <= 0 {
		plotW = min(max(int((to-from)/(100*time.Millisecond)), 800), maxW)
	}
	p := &plot{from: from, to: to, w: float64(plotW)}

	rows := candidates(x)
	rowOf := make(map[string]int, len(rows))
	for i, c := range rows {
		rowOf[c] = i
	}
	kinds := slices.Sorted(maps.Keys(r.FaultsByKind))
	kindColour := make(map[string]string, len(kinds))
	for i, k := range kinds {
		kindColour[k] = faultColours[i%len(faultColours)]
	}

	top := float64(svgHeader + svgMarkers)
	rowsH := float64(len(rows) * svgRow)
	width := svgLeft + plotW + svgRight
	height := int(top+rowsH) + svgAxis + legendLines(len(kinds), width)*svgLegendLn + 10

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	writeHeader(&b, r, from, to)

	// Fault bands, behind everything.
	faultByID := make(map[int]record.Fault, len(x.faults))
	for _, f := range x.faults {
		faultByID[f.ID] = f
	}
	b.WriteString(`<g id="faults">` + "\n")
	for _, fr := range r.FaultRecovery {
		if fr.Window.End < from || fr.Start > to {
			continue
		}
		f := faultByID[fr.ID]
		x0, x1 := p.x(fr.Start), p.x(max(fr.End, fr.Start))
		colour := kindColour[fr.Kind]
		title := fmt.Sprintf("fault %d %s → %s (holder %s): %s to %s, %s", f.ID, f.Kind, f.Target, orNone(f.Holder), f.Start, f.End, f.End-f.Start)
		if f.Paused {
			title += ", paused"
		}
		if f.Note != "" {
			title += "; " + f.Note
		}
		if fr.Interrupted {
			title += fmt.Sprintf("; leaderless %s, recovered after %s", fr.Leaderless, fr.Recovery)
		}
		if row, ok := rowOf[f.Target]; ok {
			// A fault on one candidate: strong on its row, faint across.
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.1"/>`+"\n",
				x0, top, max(x1-x0, 1), rowsH, colour)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%d" fill="%s" fill-opacity="0.5"><title>%s</title></rect>`+"\n",
				x0, top+float64(row*svgRow), max(x1-x0, 1), svgRow, colour, esc(title))
		} else {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.35"><title>%s</title></rect>`+"\n",
				x0, top, max(x1-x0, 1), rowsH, colour, esc(title))
		}
		if fr.Window.End > fr.End {
			w0, w1 := p.x(fr.End), p.x(fr.Window.End)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.12"><title>fault %d recovery window: to %s</title></rect>`+"\n",
				w0, top, max(w1-w0, 0.5), rowsH, colour, f.ID, fr.Window.End)
		}
	}
	b.WriteString("</g>\n")

	// Row labels and guides.
	for i, c := range rows {
		y := top + float64(i*svgRow)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end" dominant-baseline="middle">%s</text>`+"\n", svgLeft-8, y+svgRow/2, esc(c))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.0f" y2="%.0f" stroke="#e4e4e4"/>`+"\n", svgLeft, svgLeft+plotW, y+svgRow, y+svgRow)
	}

	writeChildren(&b, x, p, rowOf, top)
	writeStale(&b, x, p, rowOf, top)
	writeViolations(&b, x, p, rowOf, top)
	writeAxis(&b, p, top+rowsH)
	writeLegend(&b, kinds, kindColour, top+rowsH+svgAxis, width)
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// plot maps the run's clock to x.
type plot struct {
	from, to time.Duration
	w        float64
}

// x returns the x of t, clamped to the plot.
func (p *plot) x(t time.Duration) float64 {
	t = min(max(t, p.from), p.to)
	return svgLeft + float64(t-p.from)/float64(p.to-p.from)*p.w
}

// in reports whether [a, b] meets the window.
func (p *plot) in(a, b time.Duration) bool { return b >= p.from && a <= p.to }

func writeHeader(b *strings.Builder, r Report, from, to time.Duration) {
	verdict := "PASS"
	if f := r.Failures(); len(f) > 0 {
		verdict = "FAIL: " + strings.Join(f, "; ")
	}
	line1 := fmt.Sprintf("baton-chaos · %s · seed %d · %s run · %d faults · %d terms · %d writes (%d refused) · showing %s to %s",
		orNone(r.Backend), r.Seed, r.Duration.Round(time.Millisecond), r.Faults, r.Terms, r.Writes, r.Refused, from.Round(time.Millisecond), to.Round(time.Millisecond))
	if r.Broken != "" {
		line1 += " · broken build: " + r.Broken
	}
	fmt.Fprintf(b, `<text x="10" y="18" font-weight="bold">%s</text>`+"\n", esc(line1))
	colour := "#2a7d2a"
	if verdict != "PASS" {
		colour = colourBad
	}
	fmt.Fprintf(b, `<text x="10" y="34" fill="%s">fencing violations %d · token regressions %d · unexplained overlaps %d · paused overlaps %d · availability outside faults %.5f · %s</text>`+"\n",
		colour, r.Fencing.Violations, r.Tokens.Regressions, r.Overlaps.Unexplained, r.Overlaps.Paused, r.Availability.Fraction, esc(verdict))
	fmt.Fprintf(b, `<text x="10" y="50" fill="#555">%s</text>`+"\n", esc(r.Command))
}

// writeChildren draws each child: a thin line over its whole activity, and
// bars where its accepted writes came at most GapTolerance apart.
func writeChildren(b *strings.Builder, x *history, p *plot, rowOf map[string]int, top float64) {
	tol := GapTolerance(x.heartbeat)
	termIndex := make(map[*term]int, len(x.terms))
	for i, t := range x.terms {
		termIndex[t] = i
	}
	b.WriteString(`<g id="children">` + "\n")
	for _, c := range x.children {
		if !p.in(c.first, c.last) {
			continue
		}
		y := top + float64(rowOf[c.ref.Candidate]*svgRow) + (svgRow-svgBar)/2
		colour := termColours[termIndex[c.term]%2]
		title := fmt.Sprintf("%s token %d pid %d: %s to %s", c.ref.Candidate, c.ref.Token, c.ref.PID, c.first, c.last)
		x0, x1 := p.x(c.first), p.x(c.last)
		fmt.Fprintf(b, `<g><title>%s</title><rect x="%.1f" y="%.1f" width="%.1f" height="2" fill="%s"/>`,
			esc(title), x0, y+svgBar/2-1, max(x1-x0, 1), colour)
		var segs []Interval
		for _, at := range c.acceptedAt {
			if at < p.from-tol || at > p.to {
				continue
			}
			if n := len(segs); n > 0 && at-segs[n-1].End <= tol {
				segs[n-1].End = at
				continue
			}
			segs = append(segs, Interval{at, at})
		}
		// Bars less than a pixel apart merge, so a child draws at most
		// one bar per pixel.
		bar := func(x0, x1 float64) {
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="%s"/>`, x0, y, max(x1-x0, 1), svgBar, colour)
		}
		var cur [2]float64
		for i, s := range segs {
			s0, s1 := p.x(s.Start), p.x(s.End)
			switch {
			case i == 0:
				cur = [2]float64{s0, s1}
			case s0 <= cur[1]+1:
				cur[1] = s1
			default:
				bar(cur[0], cur[1])
				cur = [2]float64{s0, s1}
			}
		}
		if len(segs) > 0 {
			bar(cur[0], cur[1])
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</g>\n")
}

// writeStale draws refused writes as red ticks, one per pixel column and
// row at most, with a count in the tooltip.
func writeStale(b *strings.Builder, x *history, p *plot, rowOf map[string]int, top float64) {
	type key struct{ row, col int }
	counts := map[key]int{}
	var order []key
	for _, w := range x.writes {
		if w.Accepted || w.At < p.from || w.At > p.to {
			continue
		}
		k := key{rowOf[w.Candidate], int(p.x(w.At))}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	b.WriteString(`<g id="stale">` + "\n")
	for _, k := range order {
		y := top + float64(k.row*svgRow)
		fmt.Fprintf(b, `<rect x="%d" y="%.0f" width="1" height="6" fill="%s"><title>%d stale writes refused</title></rect>`+"\n",
			k.col, y+2, colourStale, counts[k])
	}
	b.WriteString("</g>\n")
}

// writeViolations marks overlaps (red: unexplained, orange: paused) over the
// rows of both children, and fencing violations, with markers above.
func writeViolations(b *strings.Builder, x *history, p *plot, rowOf map[string]int, top float64) {
	marked := map[int]bool{} // marker columns already drawn
	marker := func(at time.Duration, colour, title string) {
		col := int(p.x(at))
		if marked[col] {
			return
		}
		marked[col] = true
		y := float64(svgHeader) + 2
		fmt.Fprintf(b, `<path d="M%d %.0f h10 l-5 12 z" fill="%s"><title>%s</title></path>`+"\n", col-5, y, colour, esc(title))
	}
	b.WriteString(`<g id="violations">` + "\n")
	drawn := map[[3]int]bool{} // one box per row pair and pixel column
	x.eachOverlap(func(o Overlap) {
		if !p.in(o.Start, o.End) {
			return
		}
		colour, what := colourBad, "unexplained overlap"
		if o.PausedBy != 0 {
			colour, what = colourPaused, fmt.Sprintf("overlap explained by paused fault %d", o.PausedBy)
		}
		r0, r1 := rowOf[o.Stale.Candidate], rowOf[o.Newer.Candidate]
		if r0 > r1 {
			r0, r1 = r1, r0
		}
		x0, x1 := p.x(o.Start), p.x(o.End)
		k := [3]int{r0, r1, int(x0)}
		if drawn[k] {
			return
		}
		drawn[k] = true
		title := fmt.Sprintf("%s %s to %s (%s): %s token %d pid %d (stale, %d accepted) and %s token %d pid %d",
			what, o.Start, o.End, o.Len(), o.Stale.Candidate, o.Stale.Token, o.Stale.PID, o.StaleAccepted, o.Newer.Candidate, o.Newer.Token, o.Newer.PID)
		y0 := top + float64(r0*svgRow) + 1
		y1 := top + float64((r1+1)*svgRow) - 1
		fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.25" stroke="%s"><title>%s</title></rect>`+"\n",
			x0, y0, max(x1-x0, 1), y1-y0, colour, colour, esc(title))
		if o.PausedBy == 0 {
			marker(o.Start, colourBad, title)
		}
	})
	var highest uint64
	seen := false
	for _, w := range x.writes {
		if !w.Accepted {
			continue
		}
		if seen && w.Token < highest && w.At >= p.from && w.At <= p.to {
			title := fmt.Sprintf("fencing violation at %s: %s token %d pid %d accepted after token %d", w.At, w.Candidate, w.Token, w.PID, highest)
			col := p.x(w.At)
			y := top + float64(rowOf[w.Candidate]*svgRow)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.0f" width="2" height="%d" fill="%s"><title>%s</title></rect>`+"\n", col-1, y, svgRow, colourBad, esc(title))
			marker(w.At, colourBad, title)
		}
		seen, highest = true, max(highest, w.Token)
	}
	b.WriteString("</g>\n")
}

// tickSteps are the axis steps to choose from.
var tickSteps = []time.Duration{
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// writeAxis draws a time axis with the smallest step that leaves at least
// 90 px between labels.
func writeAxis(b *strings.Builder, p *plot, y float64) {
	span := p.to - p.from
	step := tickSteps[len(tickSteps)-1]
	for _, s := range tickSteps {
		if float64(s)/float64(span)*p.w >= 90 {
			step = s
			break
		}
	}
	fmt.Fprintf(b, `<g id="axis"><line x1="%d" x2="%.0f" y1="%.0f" y2="%.0f" stroke="#333"/>`+"\n", svgLeft, svgLeft+p.w, y, y)
	for t := (p.from + step - 1) / step * step; t <= p.to; t += step {
		tx := p.x(t)
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#333"/><text x="%.1f" y="%.0f" text-anchor="middle" font-size="11">%s</text>`+"\n",
			tx, tx, y, y+5, tx, y+18, esc(t.String()))
	}
	b.WriteString("</g>\n")
}

// writeLegend lays the legend out in columns of legendItem pixels across
// the drawing's width.
func writeLegend(b *strings.Builder, kinds []string, kindColour map[string]string, y float64, width int) {
	type entry struct{ colour, opacity, label string }
	entries := []entry{
		{termColours[0], "1", "term (colours alternate)"},
		{termColours[1], "1", "next term"},
		{colourStale, "1", "stale write refused"},
		{colourBad, "0.5", "unexplained overlap, fencing violation"},
		{colourPaused, "0.5", "overlap in a paused fault"},
		{colourRecover, "0.12", "recovery window after a fault"},
	}
	for _, k := range kinds {
		entries = append(entries, entry{kindColour[k], "0.35", "fault: " + k})
	}
	cols := max(1, (width-10)/legendItem)
	b.WriteString(`<g id="legend">` + "\n")
	for i, e := range entries {
		x := 10 + float64(i%cols*legendItem)
		ly := y + 4 + float64(i/cols*svgLegendLn)
		fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="14" height="10" fill="%s" fill-opacity="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			x, ly, e.colour, e.opacity, x+18, ly+9, esc(e.label))
	}
	b.WriteString("</g>\n")
}

// legendLines is how many lines writeLegend takes.
func legendLines(kinds, width int) int {
	cols := max(1, (width-10)/legendItem)
	return (6 + kinds + cols - 1) / cols
}

// candidates lists the candidates that wrote, in natural order (c2 before
// c10).
func candidates(x *history) []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range x.children {
		if !seen[c.ref.Candidate] {
			seen[c.ref.Candidate] = true
			out = append(out, c.ref.Candidate)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		if c := cmp.Compare(len(a), len(b)); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// esc escapes s for XML text and attribute values.
func esc(s string) string {
	var b strings.Builder
	// EscapeText writes only to b, which cannot fail.
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
