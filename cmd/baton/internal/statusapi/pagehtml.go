package statusapi

import (
	"bytes"
	"strconv"
	"strings"
)

// The page is written by Go code rather than by html/template: executing a
// template calls methods by name through reflection, and a binary that can
// do that keeps every exported method of every type stored in an
// interface, since the linker cannot tell which ones a template calls. For
// the CLI that is most of its size (all of the EC2, SSM and Kubernetes API
// clients). Every value that comes from outside (lease names, candidate
// and member IDs, backend URLs, errors) goes through esc, which escapes as
// html/template does in text and quoted attributes; the style and script
// blocks are this package's own files, written as they are (the
// Content-Security-Policy allows exactly them, by hash).

// pageWriter writes HTML.
type pageWriter struct{ bytes.Buffer }

// raw writes markup.
func (w *pageWriter) raw(ss ...string) {
	for _, s := range ss {
		w.WriteString(s)
	}
}

// htmlEscaper escapes what html/template escapes in text and quoted
// attribute values.
var htmlEscaper = strings.NewReplacer(
	"\x00", "\uFFFD",
	`"`, "&#34;",
	"&", "&amp;",
	"'", "&#39;",
	"+", "&#43;",
	"<", "&lt;",
	">", "&gt;",
)

// esc writes s escaped for text and quoted attribute values.
func (w *pageWriter) esc(s string) { htmlEscaper.WriteString(w, s) }

func (w *pageWriter) int(n int)     { w.WriteString(strconv.Itoa(n)) }
func (w *pageWriter) num(f float64) { w.esc(strconv.FormatFloat(f, 'g', -1, 64)) }
func (w *pageWriter) uint(n uint64) { w.WriteString(strconv.FormatUint(n, 10)) }
func (w *pageWriter) int64(n int64) { w.WriteString(strconv.FormatInt(n, 10)) }
func (w *pageWriter) when(c bool, s string) {
	if c {
		w.WriteString(s)
	}
}

// writePage writes the whole page.
func (w *pageWriter) writePage(d *pageData) {
	w.raw("<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
		"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>baton ")
	w.esc(d.Kind)
	w.raw(" · ")
	w.esc(d.Member)
	w.raw("</title>\n<link rel=\"icon\" href=\"data:,\">\n<noscript><meta http-equiv=\"refresh\" content=\"")
	w.int64(d.RefreshSeconds)
	w.raw("\"></noscript>\n<style>", d.Style, "</style>\n</head>\n<body>\n<header class=\"top\">\n  <div class=\"brand\"><span class=\"mark\">baton</span> ")
	w.esc(d.Kind)
	w.raw("</div>\n  <div class=\"who\">")
	if d.Kind == "agent" {
		w.raw("member")
	} else {
		w.raw("candidate")
	}
	w.raw(" <code>")
	w.esc(d.Member)
	w.raw("</code>")
	if d.IsGroup && d.Kind != "agent" {
		w.raw(" · raft member <code>")
		w.esc(d.NodeID)
		w.raw("</code>")
	}
	w.raw("</div>\n  <div id=\"refresh\" class=\"refresh\">refreshes every ")
	w.int64(d.RefreshSeconds)
	w.raw(" s</div>\n</header>\n<main id=\"live\" data-refresh=\"")
	w.int64(d.RefreshMS)
	w.raw("\">\n")
	w.writeLive(d)
	w.raw("\n</main>\n<footer>\n  <h2>HTTP API</h2>\n  <ul class=\"api\">\n",
		"    <li><a href=\"v1/leases\"><code>GET /v1/leases</code></a> the lease table (JSON)</li>\n",
		"    <li><code>GET /v1/leases/NAME</code> one lease; 404 ")
	if d.IsGroup {
		w.raw("when the group has no record of it")
	} else {
		w.raw("for a lease this process does not campaign for")
	}
	w.raw("</li>\n")
	w.when(d.Resign, "    <li><code>POST /v1/leases/NAME/resign?wait=10s</code> ask the holder to resign: 200 released, 202 requested, 404 no holder; needs the bearer token</li>\n")
	w.raw("    <li><code>GET /v1/health/leader?lease=NAME</code> 200 ")
	w.esc(d.Here)
	w.raw(" leads, 429 standby, 503 undetermined</li>\n")
	w.when(d.IsGroup, "    <li><a href=\"v1/group\"><code>GET /v1/group</code></a> the raft group as this member sees it (JSON)</li>\n")
	w.raw("    <li><a href=\"metrics\"><code>GET /metrics</code></a> Prometheus metrics</li>\n  </ul>\n</footer>\n<script>",
		d.Script, "</script>\n</body>\n</html>")
}

// writeLive writes the part of the page that its script refreshes.
func (w *pageWriter) writeLive(d *pageData) {
	w.raw("<section class=\"cards\">\n  <div class=\"card\">\n    <div class=\"k\">")
	if d.IsGroup {
		w.raw("Group")
	} else {
		w.raw("Leadership")
	}
	w.raw("</div>\n    ")
	if d.Determined {
		w.raw("<div class=\"v ok\">determined</div><div class=\"sub\">")
		if d.IsGroup {
			w.raw("a raft leader and a quorum answer")
		} else {
			w.raw("this process can ask who leads")
		}
		w.raw("</div>\n")
	} else {
		w.raw("<div class=\"v bad\">undetermined</div><div class=\"sub\">")
		w.esc(d.Why)
		w.raw("</div>\n")
	}
	w.raw("  </div>\n")
	switch {
	case d.IsGroup:
		w.raw("  <div class=\"card\">\n    <div class=\"k\">Raft leader</div>\n    <div class=\"v mono\">")
		if d.Leader != "" {
			w.esc(d.Leader)
		} else {
			w.raw("none")
		}
		w.raw("</div>\n    <div class=\"sub\">raft role of this member: ")
		w.esc(d.State)
		w.raw(" (a raft role, not a lease: the lease holders are below)</div>\n  </div>\n",
			"  <div class=\"card\">\n    <div class=\"k\">Members</div>\n    <div class=\"v\">")
		w.int(d.Members)
		w.raw("</div>\n    <div class=\"sub\">")
		w.int(d.Voters)
		w.raw(" voting</div>\n  </div>\n")
	case d.Backend != "":
		w.raw("  <div class=\"card\">\n    <div class=\"k\">Backend URL</div>\n    <div class=\"v mono\">")
		w.esc(d.Backend)
		w.raw("</div>\n    <div class=\"sub\">this process campaigns on it</div>\n  </div>\n")
	}
	w.raw("  <div class=\"card\">\n    <div class=\"k\">Leases held</div>\n    <div class=\"v\">")
	w.int(d.Held)
	w.raw("<span class=\"of\"> of ")
	w.int(len(d.Leases))
	w.raw("</span></div>\n    <div class=\"sub\">")
	w.int(d.HeldHere)
	w.raw(" by ")
	w.esc(d.Here)
	if d.IsGroup {
		w.raw(" · ")
		w.int(d.Waiting)
		if d.Waiting == 1 {
			w.raw(" candidate waiting")
		} else {
			w.raw(" candidates waiting")
		}
	}
	w.raw("</div>\n  </div>\n</section>\n\n<section class=\"panel\">\n  <h2>Leases <span class=\"aside\">as of ")
	w.esc(d.Now)
	w.raw("</span></h2>\n")
	if d.TableErr != "" {
		w.raw("  <div class=\"alert\">Could not read the lease table")
		w.when(d.IsGroup, " through the raft leader")
		w.raw(": ")
		w.esc(d.TableErr)
		w.raw("</div>\n")
	}
	w.raw("  <table class=\"leases\">\n",
		"    <thead><tr><th>Lease</th><th>Holder</th><th class=\"num\">Token</th><th>Since (UTC)</th><th>Safe until (UTC)</th><th class=\"num\">Waiting</th><th>Via member</th></tr></thead>\n",
		"    <tbody>\n")
	for _, l := range d.Leases {
		w.writeLeaseRow(d, &l)
	}
	if len(d.Leases) == 0 {
		w.raw("    <tr><td colspan=\"7\" class=\"empty\">No leases: nobody holds or waits for one.</td></tr>\n")
	}
	w.raw("    </tbody>\n  </table>\n</section>\n\n")
	w.writeTimeline(d)
}

func (w *pageWriter) writeLeaseRow(d *pageData, l *leaseRow) {
	w.raw("    <tr")
	w.when(l.Here, " class=\"here\"")
	w.raw(">\n      <td class=\"mono\"><a href=\"")
	w.esc(l.Href)
	w.raw("\">")
	w.esc(l.Name)
	w.raw("</a></td>\n")
	if l.Free {
		w.raw("      <td class=\"free\" colspan=\"4\">free</td>\n")
	} else {
		w.raw("      <td class=\"mono\"><svg class=\"swatch\" width=\"10\" height=\"10\" aria-hidden=\"true\"><rect width=\"10\" height=\"10\" rx=\"2\" fill=\"")
		if l.Colour != "" {
			w.esc(l.Colour)
		} else {
			w.raw("#9aa5b1")
		}
		w.raw("\"/></svg>")
		w.esc(l.Holder)
		w.when(l.Resign, " <span class=\"tag warn\">resign requested</span>")
		w.raw("</td>\n      <td class=\"num mono\">")
		w.uint(l.Token)
		w.raw("</td>\n      <td>")
		w.esc(l.Since)
		w.raw(" <span class=\"dim\">")
		w.esc(l.Ago)
		w.raw("</span></td>\n      <td>")
		if l.SafeUntil != "" {
			w.esc(l.SafeUntil)
			w.raw(" <span class=\"margin ")
			w.esc(l.MarginClass)
			w.raw("\">")
			w.esc(l.Margin)
			w.raw("</span>")
		} else {
			w.raw("<span class=\"dim\">unknown</span>")
		}
		w.raw("</td>\n")
	}
	w.raw("      <td class=\"num\">")
	w.int(l.Waiters)
	w.raw("</td>\n      <td>")
	switch {
	case l.Here:
		if d.Kind == "agent" {
			w.raw("<span class=\"tag ok\">this agent</span>")
		} else {
			w.raw("<span class=\"tag ok\">this process</span>")
		}
	case !l.Free:
		w.raw("<span class=\"dim mono\">")
		w.esc(l.Member)
		w.raw("</span>")
	}
	w.raw("</td>\n    </tr>\n")
}

func (w *pageWriter) writeTimeline(d *pageData) {
	t := &d.Timeline
	w.raw("<section class=\"panel\">\n  <h2>Leadership <span class=\"aside\">last ")
	w.esc(t.WindowLabel)
	w.raw(", ")
	w.esc(t.From)
	w.raw(" – ")
	w.esc(t.To)
	w.raw(" UTC · ")
	w.int(t.Terms)
	w.raw(" terms, ")
	w.int(t.Running)
	w.raw(" running")
	if t.Lost != 0 {
		w.raw(", ")
		w.int(t.Lost)
		w.raw(" lost")
	}
	w.raw("</span>\n    <span class=\"zoom\">")
	for _, z := range d.Zoom {
		w.raw("<a href=\"")
		w.esc(z.Href)
		w.raw("\"")
		w.when(z.Active, " class=\"active\"")
		w.raw(">")
		w.esc(z.Label)
		w.raw("</a>")
	}
	w.raw("</span></h2>\n  <div class=\"legend\">\n    ")
	for _, l := range t.Legend {
		w.raw("<span class=\"item\"><svg width=\"12\" height=\"12\" aria-hidden=\"true\"><rect width=\"12\" height=\"12\" rx=\"2\" fill=\"")
		w.esc(l.Colour)
		w.raw("\"/></svg><span class=\"mono\">")
		w.esc(l.Holder)
		w.raw("</span></span>")
	}
	w.raw("\n")
	if t.MoreHolders != 0 {
		w.raw("    <span class=\"item dim\">+")
		w.int(t.MoreHolders)
		w.raw(" more holders</span>\n")
	}
	w.raw(`    <span class="key"><svg width="22" height="12" aria-hidden="true"><rect width="22" height="12" rx="2" fill="#9aa5b1"/><rect x="19" width="3" height="12" fill="#c62828"/></svg>lost (session expired)</span>
    <span class="key"><svg width="22" height="12" aria-hidden="true"><rect width="22" height="12" fill="url(#legend-hatch)"/><defs><pattern id="legend-hatch" width="5" height="5" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="5" height="5" fill="#eef1f4"/><rect width="1.6" height="5" fill="#c3cad2"/></pattern></defs></svg>not observed</span>
    <span class="key"><svg width="14" height="12" aria-hidden="true"><line x1="7" x2="7" y1="0" y2="12" stroke="#1f2933" stroke-width="1.5" stroke-dasharray="3 2"/></svg>now</span>
  </div>
  <svg class="timeline" width="`)
	w.int(t.Width)
	w.raw("\" height=\"")
	w.int(t.Height)
	w.raw("\" viewBox=\"0 0 ")
	w.int(t.Width)
	w.raw(" ")
	w.int(t.Height)
	w.raw("\" role=\"img\" aria-label=\"Terms of each lease over the last ")
	w.esc(t.WindowLabel)
	w.raw(`">
    <defs>
      <pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#eef1f4"/><rect width="2" height="6" fill="#d5dbe1"/></pattern>
    </defs>
    `)
	for _, r := range t.Rows {
		w.raw("<rect class=\"row")
		w.when(r.Even, " even")
		w.raw("\" x=\"0\" y=\"")
		w.num(r.Y)
		w.raw("\" width=\"")
		w.int(t.Width)
		w.raw("\" height=\"30\"/>")
	}
	w.raw("\n")
	if t.Unobserved {
		w.raw("    <rect class=\"unobserved\" x=\"")
		w.num(t.PlotLeft)
		w.raw("\" y=\"")
		w.num(t.RowsTop)
		w.raw("\" width=\"")
		w.num(t.UnobservedW)
		w.raw("\" height=\"")
		w.num(t.RowsHeight)
		w.raw("\" fill=\"url(#hatch)\"><title>Not observed: this process started at ")
		w.esc(t.UnobservedSince)
		w.raw(" UTC; terms that ended before are not shown.</title></rect>\n")
	}
	w.raw("    ")
	for _, k := range t.Ticks {
		w.raw("<line class=\"grid\" x1=\"")
		w.num(k.X)
		w.raw("\" x2=\"")
		w.num(k.X)
		w.raw("\" y1=\"")
		w.num(t.RowsTop)
		w.raw("\" y2=\"")
		w.int(t.Height)
		w.raw("\"/><text class=\"tick\" x=\"")
		w.num(k.X)
		w.raw("\" y=\"")
		w.num(t.AxisY)
		w.raw("\" text-anchor=\"middle\">")
		w.esc(k.Label)
		w.raw("</text>")
	}
	w.raw("\n    <line class=\"axis\" x1=\"")
	w.num(t.PlotLeft)
	w.raw("\" x2=\"")
	w.num(t.PlotRight)
	w.raw("\" y1=\"")
	w.num(t.RowsTop)
	w.raw("\" y2=\"")
	w.num(t.RowsTop)
	w.raw("\"/>\n")
	for _, r := range t.Rows {
		w.raw("    <text class=\"lease\" x=\"8\" y=\"")
		w.num(r.TextY)
		w.raw("\"><title>")
		w.esc(r.Name)
		w.raw("</title>")
		w.esc(r.Short)
		w.raw("</text>\n")
		if r.Empty {
			w.raw("    <text class=\"none\" x=\"")
			w.num(t.PlotLeft)
			w.raw("\" dx=\"6\" y=\"")
			w.num(r.TextY)
			w.raw("\">no term in the window</text>\n")
		}
		for _, b := range r.Bars {
			w.raw("    <g class=\"bar\">\n      <rect class=\"term")
			w.when(b.Running, " running")
			w.when(b.Lost, " lost")
			w.raw("\" x=\"")
			w.num(b.X)
			w.raw("\" y=\"")
			w.num(b.Y)
			w.raw("\" width=\"")
			w.num(b.W)
			w.raw("\" height=\"")
			w.num(b.H)
			w.raw("\" rx=\"3\" fill=\"")
			w.esc(b.Fill)
			w.raw("\" data-lease=\"")
			w.esc(b.Lease)
			w.raw("\" data-token=\"")
			w.uint(b.Token)
			w.raw("\" data-holder=\"")
			w.esc(b.Holder)
			w.raw("\"><title>")
			w.esc(b.Title)
			w.raw("</title></rect>\n")
			if b.Lost {
				w.raw("      <rect class=\"lostcap\" x=\"")
				w.num(b.CapX)
				w.raw("\" y=\"")
				w.num(b.Y)
				w.raw("\" width=\"3\" height=\"")
				w.num(b.H)
				w.raw("\"/>\n")
			}
			if b.Label != "" {
				w.raw("      <text class=\"label\" x=\"")
				w.num(b.LabelX)
				w.raw("\" y=\"")
				w.num(b.LabelY)
				w.raw("\" fill=\"")
				w.esc(b.Ink)
				w.raw("\">")
				w.esc(b.Label)
				w.raw("</text>\n")
			}
			w.raw("    </g>\n")
		}
	}
	if len(t.Rows) == 0 {
		w.raw("    <text class=\"none\" x=\"")
		w.num(t.PlotLeft)
		w.raw("\" dx=\"6\" y=\"")
		w.num(t.EmptyY)
		w.raw("\">No lease had a term in the last ")
		w.esc(t.WindowLabel)
		w.raw(".</text>\n")
	}
	w.raw("    <line class=\"now\" x1=\"")
	w.num(t.PlotRight)
	w.raw("\" x2=\"")
	w.num(t.PlotRight)
	w.raw("\" y1=\"")
	w.num(t.RowsTop)
	w.raw("\" y2=\"")
	w.int(t.Height)
	w.raw("\"/>\n    <text class=\"tick now-label\" x=\"")
	w.num(t.PlotRight)
	w.raw("\" y=\"")
	w.num(t.AxisY)
	w.raw("\" text-anchor=\"middle\">now</text>\n  </svg>\n")
	if t.Hidden != 0 {
		w.raw("  <p class=\"dim\">")
		w.int(t.Hidden)
		w.raw(" more leases are not drawn; see <a href=\"v1/leases\">/v1/leases</a>.</p>\n")
	}
	if t.Untracked != 0 {
		w.raw("  <p class=\"dim\">")
		w.int(t.Untracked)
		w.raw(" leases were not remembered (the history keeps at most MaxLeases).</p>\n")
	}
	w.raw("</section>\n")
}
