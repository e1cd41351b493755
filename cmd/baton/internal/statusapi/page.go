package statusapi

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// The status page is server-rendered (pagehtml.go, which escapes lease
// names and candidate IDs as html/template does) with its CSS and a 20-line script inline, and no
// other resource: it works offline, behind any proxy, and needs no build
// step. The script refreshes the page's live part every Options.Refresh by
// fetching ui/live (the same markup, server-rendered) and swapping it in:
// unlike a meta refresh it keeps the scroll position and an open tooltip,
// pauses while the tab is hidden, and says so when the process stops
// answering. Without JavaScript a <noscript> meta refresh reloads the page.
// A Content-Security-Policy allows that one script and style block by hash
// and nothing else, so even a name that escaped escaping could not run.

//go:embed style.css refresh.js
var assets embed.FS

var (
	styleCSS  = mustRead("style.css")
	refreshJS = mustRead("refresh.js")
	pageCSP   = fmt.Sprintf("default-src 'none'; script-src '%s'; style-src '%s'; connect-src 'self'; img-src data:; "+
		"base-uri 'none'; form-action 'none'; frame-ancestors 'none'", hashSource(refreshJS), hashSource(styleCSS))
)

func mustRead(name string) string {
	b, err := assets.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func hashSource(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256-" + base64.StdEncoding.EncodeToString(sum[:])
}

// pageData is the model of the page and of its live part.
type pageData struct {
	Style     string // this package's style.css, written as it is
	Script    string // this package's refresh.js, written as it is
	RefreshMS int64
	// RefreshSeconds is the no-script meta refresh, rounded up.
	RefreshSeconds int64
	Resign         bool   // the server serves POST .../resign, behind a token
	Kind           string // agent, run or cron
	Here           string // whose leases are held here
	Backend        string // the backend, when the page names it
	Member         string
	IsGroup        bool // the source is a raft member: NodeID, State, Leader, Members, Voters
	NodeID         string
	State          string
	Leader         string
	Members        int
	Voters         int
	Determined     bool
	Why            string // why not determined
	Now            string
	Leases         []leaseRow
	TableErr       string
	Held           int
	HeldHere       int
	Waiting        int
	Timeline       timeline
	Zoom           []zoomLink
}

// zoomLink selects the timeline's window.
type zoomLink struct {
	Label, Href string
	Active      bool
}

// zoomPresets are the windows the page offers, up to Options.History.
var zoomPresets = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}

// window returns the timeline window r asks for with ?window=DURATION:
// between a minute and Options.History, which is the default.
func (h *Handler) window(r *http.Request) time.Duration {
	d, err := time.ParseDuration(r.URL.Query().Get("window"))
	if err != nil || d < time.Minute || d > h.opts.History {
		return h.opts.History
	}
	return d
}

func (h *Handler) zoom(current time.Duration) []zoomLink {
	ws := []time.Duration{h.opts.History}
	for _, p := range zoomPresets {
		if p < h.opts.History {
			ws = append(ws, p)
		}
	}
	slices.Sort(ws)
	out := make([]zoomLink, 0, len(ws))
	for _, w := range ws {
		href := "?window=" + shortDuration(w)
		if w == h.opts.History {
			href = "./"
		}
		out = append(out, zoomLink{Label: shortDuration(w), Href: href, Active: w == current})
	}
	return out
}

// shortDuration writes 5m for 5m0s, 1h for 1h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// leaseRow is one line of the lease table.
type leaseRow struct {
	Name, Href     string
	Free           bool
	Holder, Colour string
	Token          uint64
	Member         string
	Since, Ago     string
	SafeUntil      string
	Margin         string
	MarginClass    string // ok, warn, bad
	Waiters        int
	Here           bool
	Resign         bool
}

func (h *Handler) pageData(r *http.Request) pageData {
	ctx := r.Context()
	now := h.opts.Now()
	d := pageData{
		Style: styleCSS, Script: refreshJS, RefreshMS: h.opts.Refresh.Milliseconds(),
		RefreshSeconds: int64((h.opts.Refresh + time.Second - 1) / time.Second), Resign: h.opts.Resign,
		Kind: h.opts.Kind, Here: h.opts.Here, Backend: h.opts.Backend,
		Member: h.src.ID(), Now: now.UTC().Format("2006-01-02 15:04:05 UTC"),
	}
	if gs, ok := h.src.(GroupSource); ok {
		if g, ok := gs.Group(); ok {
			d.IsGroup, d.NodeID, d.State, d.Leader, d.Members, d.Voters = true, g.ID, g.State, g.Leader, len(g.Members), len(g.Voters)
		}
	}
	if err := h.src.Determined(); err != nil {
		d.Why = err.Error()
	} else {
		d.Determined = true
	}
	rctx, cancel := context.WithTimeout(ctx, h.opts.ReadTimeout)
	infos, err := h.src.Leases(rctx)
	cancel()
	if err != nil {
		d.TableErr = err.Error()
	}
	hist, untracked := h.hist.snapshot()
	win := h.window(r)
	d.Zoom = h.zoom(win)
	d.Timeline = buildTimeline(now, win, h.hist.started, hist, untracked, infos)
	col := map[string]string{}
	for _, l := range d.Timeline.Legend {
		col[l.Holder] = l.Colour
	}
	for _, in := range infos {
		r := leaseRow{Name: in.Name, Href: "v1/leases/" + url.PathEscape(in.Name), Free: in.Holder == "",
			Holder: in.Holder, Colour: col[in.Holder], Token: in.Token, Member: in.Member, Waiters: in.Waiters,
			Here: heldHere(h.src, in.Holder, in.Member), Resign: in.ResignRequested}
		if !in.Since.IsZero() && !r.Free {
			r.Since = in.Since.UTC().Format("15:04:05")
			r.Ago = durationLabel(now.Sub(in.Since)) + " ago"
		}
		if !in.SafeUntil.IsZero() && !r.Free {
			m := in.SafeUntil.Sub(now)
			r.SafeUntil = in.SafeUntil.UTC().Format("15:04:05.000")
			r.Margin = fmt.Sprintf("%+.1fs", m.Seconds())
			switch {
			case m <= 0:
				r.MarginClass = "bad"
			case m < 2*time.Second:
				r.MarginClass = "warn"
			default:
				r.MarginClass = "ok"
			}
		}
		if !r.Free {
			d.Held++
		}
		if r.Here {
			d.HeldHere++
		}
		d.Waiting += in.Waiters
		d.Leases = append(d.Leases, r)
	}
	return d
}

// GET /
func (h *Handler) servePage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "page")
}

// GET /ui/live: the page's live part, which its script swaps in.
func (h *Handler) serveLive(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "live")
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, name string) {
	var buf pageWriter
	d := h.pageData(r)
	if name == "live" {
		buf.writeLive(&d)
	} else {
		buf.writePage(&d)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", pageCSP)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "no-referrer")
	_, _ = w.Write(buf.Bytes())
}
