// Package statusapi is the read-only HTTP API that every long-running baton
// process serves about its leases, whatever the backend: `baton agent` (a
// member of a raft group, package raftagent, which adds its own routes) and
// `baton run` / `baton cron` with --http. A Handler serves:
//
//	GET /                      the status page: the leases, their holders and
//	                           tokens, and a timeline of the last hour
//	GET /ui/live               the page's live part, which its script swaps in
//	GET /v1/leases             the leases the source knows, as JSON
//	GET /v1/leases/NAME        one lease; 404 when the source has no record of it
//	GET /v1/health/leader      200 this process (or a client of this agent)
//	                           holds the lease, 429 another does (standby),
//	                           503 undetermined; HEAD too (package health's
//	                           Handler, answering as the source decides)
//	GET /v1/group              the raft group as this member sees it (only for
//	                           a Source that is a member: GroupSource)
//	GET /metrics               Prometheus metrics (see Metrics)
//
// What it guarantees, and what not:
//
//   - A 200 from /v1/health/leader means that, at some instant during the
//     request, the source held the lease (for an ElectorSource: its term
//     had not ended and was before its safe-until). It does not mean it
//     still does when the caller acts on the answer: a load balancer that
//     routes on it can send a request to a former leader for up to one
//     probe interval. Work that must not run twice is fenced with the
//     term's token, not routed on health checks.
//   - A 429 means the backend named another holder; a 503 means the source
//     could not tell (not connected to the backend, no quorum, the read
//     failed or timed out, or nobody holds the lease). Neither ever
//     answers for a process that holds the lease.
//   - The timeline and the event metrics come from the lease events the
//     source reports, kept in memory: they start when the Handler starts,
//     are bounded (Options.MaxTerms, Options.MaxLeases, Options.History),
//     and are timed on this process's clock.
//
// Nothing here needs a credential, and nothing here changes anything: the
// routes show lease names, holders, tokens and member IDs, never a secret.
// A server that also serves calls that change something (raftagent) puts
// them behind its own authentication.
package statusapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/health"
	"github.com/batonhq/baton/internal/httpjson"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Source is what a Handler reads: a raft member (raftagent's), or one
// process's campaign (ElectorSource). Leases and lease events are the raft
// group's own types, raft.LeaseInfo and raft.LeaseEvent: a member reports
// them as the group has them; an ElectorSource on another backend fills
// the fields its backend knows (Member is then the holder's ID, Waiters 0).
type Source interface {
	// ID returns the ID that leases held here have as raft.LeaseInfo.Member.
	ID() string
	// Determined returns nil when the source can answer who holds what,
	// else why not.
	Determined() error
	// Leases returns the leases the source knows, sorted by name.
	Leases(ctx context.Context) ([]raft.LeaseInfo, error)
	// Lease returns one lease; an error wrapping baton.ErrNoLeader when the
	// source has no record of it.
	Lease(ctx context.Context, name string) (raft.LeaseInfo, error)
	// WatchLeases calls fn for each lease event, in order, from one
	// goroutine at a time; stop ends that.
	WatchLeases(fn func(raft.LeaseEvent)) (stop func())
}

// HereSource is implemented by a Source that decides itself which leases
// are held here (ElectorSource: those of its candidate). For any other
// Source a lease is held here when its Member is the Source's ID.
type HereSource interface {
	// HeldHere reports whether a lease held by holder through member is
	// held by this process (or a client of this agent).
	HeldHere(holder, member string) bool
}

// heldHere reports whether src holds (or a client of it holds) a lease
// held by holder through member.
func heldHere(src Source, holder, member string) bool {
	if holder == "" {
		return false
	}
	if hs, ok := src.(HereSource); ok {
		return hs.HeldHere(holder, member)
	}
	return member == src.ID()
}

// Group is a raft member's view of its group: IDs, no addresses.
type Group struct {
	ID      string   `json:"id"`      // this member's node ID
	State   string   `json:"state"`   // Leader, Follower, Candidate or Shutdown
	Leader  string   `json:"leader"`  // the raft leader's ID; "" when none is known
	Voters  []string `json:"voters"`  // voting members' IDs
	Members []string `json:"members"` // every member's ID, voters first
}

// GroupSource is implemented by a Source that is a member of a raft group.
// The Handler then serves GET /v1/group and shows the group on the page.
type GroupSource interface {
	// Group returns the member's view of its group; ok is false when the
	// source is not (or not yet) a member.
	Group() (g Group, ok bool)
}

// Options configures a Handler. The zero value means the documented
// defaults.
type Options struct {
	// Kind names the process on the page: "agent" (the default), "run" or
	// "cron".
	Kind string

	// Here says whose leases are "held here", in the page and in health
	// answers. Default "a client of this agent".
	Here string

	// Backend describes the backend on the page (a URL without its
	// password). Empty: not shown.
	Backend string

	// Resign lists POST /v1/leases/NAME/resign on the page: the server
	// serves it (behind a token). Default false.
	Resign bool

	// Metrics are the metrics GET /metrics serves. Nil (the default) means
	// metrics of the handler's own, whose renewal metrics stay empty.
	Metrics *Metrics

	// History is how far back the timeline reaches. Default 1 h.
	History time.Duration

	// MaxTerms bounds the terms remembered per lease. Default 500.
	MaxTerms int

	// MaxLeases bounds the leases remembered for the timeline; beyond it
	// the lease idle longest is forgotten. Default 1000.
	MaxLeases int

	// ReadTimeout bounds each read of the source: per request, and per
	// scrape for the safe-until metric. Default 2 s.
	ReadTimeout time.Duration

	// Refresh is how often the status page refreshes itself. Default 2 s.
	Refresh time.Duration

	// Logger receives log lines (group "http"). Nil (the default) means
	// silent.
	Logger *slog.Logger

	// Now is the clock. Nil (the default) means time.Now; tests set it.
	Now func() time.Time
}

func (o *Options) fill() error {
	var problems []string
	if o.Kind == "" {
		o.Kind = "agent"
	}
	if o.Here == "" {
		o.Here = "a client of this agent"
	}
	if o.History == 0 {
		o.History = time.Hour
	}
	if o.MaxTerms == 0 {
		o.MaxTerms = 500
	}
	if o.MaxLeases == 0 {
		o.MaxLeases = 1000
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 2 * time.Second
	}
	if o.Refresh == 0 {
		o.Refresh = 2 * time.Second
	}
	if o.History < time.Minute {
		problems = append(problems, fmt.Sprintf("History %s is below a minute", o.History))
	}
	if o.MaxTerms < 1 || o.MaxLeases < 1 {
		problems = append(problems, fmt.Sprintf("MaxTerms (%d) and MaxLeases (%d) must be positive", o.MaxTerms, o.MaxLeases))
	}
	if o.ReadTimeout < 0 {
		problems = append(problems, "ReadTimeout must not be negative")
	}
	if o.Refresh < 500*time.Millisecond {
		problems = append(problems, fmt.Sprintf("Refresh %s is below 500ms", o.Refresh))
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if len(problems) > 0 {
		return fmt.Errorf("statusapi: %s", strings.Join(problems, "; "))
	}
	return nil
}

// Handler serves the read-only API. It answers 404 for paths it does not
// serve. Close it when done. Safe for concurrent use.
type Handler struct {
	src    Source
	opts   Options
	log    *slog.Logger
	hist   *history
	health *health.Handler // GET /v1/health/leader

	stopWatch func()
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	mux       *http.ServeMux
}

// New returns a Handler of src's leases. It starts following the lease
// events at once, and reads the leases in the background (retrying until
// it succeeds) for the terms that began before.
func New(src Source, opts Options) (*Handler, error) {
	if src == nil {
		return nil, errors.New("statusapi: Source is nil")
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	log := opts.Logger.WithGroup("http")
	hist := newHistory(func(holder, member string) bool { return heldHere(src, holder, member) }, opts.History, opts.MaxTerms, opts.MaxLeases, opts.Metrics, opts.Now)
	if err := opts.Metrics.bind(src, hist.prune, opts.ReadTimeout, log); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Handler{src: src, opts: opts, log: log, hist: hist, ctx: ctx, cancel: cancel}
	var err error
	h.health, err = health.NewHandler(checker{h}, health.Options{ReadTimeout: opts.ReadTimeout})
	if err != nil {
		cancel()
		return nil, err
	}
	// Subscribe before reading the leases, so that no term falls between.
	h.stopWatch = src.WatchLeases(h.hist.apply)
	h.wg.Add(1)
	go h.seed()
	h.mux = http.NewServeMux()
	h.Register(h.mux)
	return h, nil
}

// Register adds the Handler's routes to mux, for a server that serves
// routes of its own beside them.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", h.servePage)
	mux.HandleFunc("GET /ui/live", h.serveLive)
	mux.HandleFunc("GET /v1/leases", h.serveLeases)
	mux.HandleFunc("GET /v1/leases/{name}", h.serveLease)
	mux.Handle("GET "+health.Path, h.health)
	mux.HandleFunc("GET /v1/group", h.serveGroup)
	mux.Handle("GET /metrics", promhttp.HandlerFor(h.opts.Metrics.gatherer(), promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(h.log.Handler(), slog.LevelWarn), Timeout: h.opts.ReadTimeout + 5*time.Second,
	}))
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Close stops following the lease events and waits for the handler's
// goroutines. Requests in flight may still complete; serve no more.
func (h *Handler) Close() {
	h.closeOnce.Do(func() {
		h.cancel()
		h.stopWatch()
		h.wg.Wait()
	})
}

// seed reads the leases for terms that began before the handler, until a
// read succeeds or the handler closes.
func (h *Handler) seed() {
	defer h.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(h.ctx, h.opts.ReadTimeout)
		infos, err := h.src.Leases(ctx)
		cancel()
		if err == nil {
			h.hist.seed(infos)
			return
		}
		h.log.Debug("reading the leases for the timeline; retrying", "err", err)
		select {
		case <-h.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// ReadContext bounds a read of the source made for r.
func (h *Handler) ReadContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.opts.ReadTimeout)
}

// AwaitEnd returns a channel that receives the end of lease's term with
// token, or of a later one, once the Handler sees it (at once when it has
// already); forget stops the wait.
func (h *Handler) AwaitEnd(lease string, token uint64) (ended <-chan Ended, forget func()) {
	return h.hist.awaitEnd(lease, token)
}

// GET /v1/group
func (h *Handler) serveGroup(w http.ResponseWriter, _ *http.Request) {
	gs, ok := h.src.(GroupSource)
	if !ok {
		httpjson.Error(w, http.StatusNotFound, "this process is not a member of a raft group: /v1/group is served by raft:// members and baton agent")
		return
	}
	g, ok := gs.Group()
	if !ok {
		httpjson.Error(w, http.StatusServiceUnavailable, "this process is not in its raft group yet")
		return
	}
	httpjson.Write(w, http.StatusOK, g)
}

// isNoLeader reports whether err says the source has no record of a lease.
func isNoLeader(err error) bool { return errors.Is(err, baton.ErrNoLeader) }
