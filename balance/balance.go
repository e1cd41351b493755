package balance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonhq/baton"
)

// Defaults applied to a zero Config field.
const (
	// DefaultMaxMembers is the number of member slots when Config.MaxMembers
	// is zero.
	DefaultMaxMembers = 64

	// DefaultRefreshInterval is Config.RefreshInterval's default.
	DefaultRefreshInterval = 5 * time.Second
)

// maxShedBackoff caps how many ShedAfter periods an instance waits between
// sheds that did not move a lease to a less loaded instance.
const maxShedBackoff = 8

// Func is the leader-only work of one lease. Its context is cancelled when the
// term ends for any reason — lost, expired at safe-until, shed to another
// instance, removed, or Run stopping — and the Group waits for Func to return
// before it resigns the lease. Send t.Token() with every write downstream.
type Func func(ctx context.Context, t baton.Term) error

// Config configures a Group. The zero value of each field means the
// documented default; Group is the only required field. A Config is a plain
// value and safe to copy.
type Config struct {
	// Group names the group of instances sharing the leases. The member slots
	// are the leases "<Group>.member-0" … "<Group>.member-<MaxMembers-1>",
	// and the member holding slot i publishes its load with the lease
	// "<Group>.load-<i>". Required; must not contain "/" (etcd and ZooKeeper
	// reject it in lease names). Lease names added to the Group must not
	// start with "<Group>.member-" or "<Group>.load-".
	Group string

	// Candidate is who campaigns, for the member slot and for every lease.
	// An empty ID means baton.NewCandidateID(). IDs must be unique per
	// process incarnation: two instances with one ID count as one member.
	Candidate baton.Candidate

	// MaxMembers is the number of member slots, and so the largest N the
	// Group can count. Instances beyond it count themselves but are not
	// counted by the others; with MaxMembers at least the number of leases
	// that changes nothing, because the fair share is then one lease anyway.
	// Zero means DefaultMaxMembers (64). Every instance of a group must use
	// the same value.
	MaxMembers int

	// RefreshInterval is how often the instance reads the member slots and
	// the other members' published loads, publishes its own, and reads the
	// holders of the leases it needs to know about (those it gave up or saw
	// free; all of them only while the published loads do not account for
	// every lease). Decisions rest on a view up to this old; each refresh
	// costs Leader requests (see docs/balance.md).
	// Zero means DefaultRefreshInterval (5 s); about the backend's renew
	// interval is a good value.
	RefreshInterval time.Duration

	// Delay is how long an instance leading k >= floor(leases/N) leases
	// waits, times k - floor(leases/N) + 1, after it saw a lease without a
	// live holder, before it campaigns for it and keeps it: so that less
	// loaded instances take free leases first. Instances usually learn of a
	// free lease within milliseconds of each other (each resigns it as a
	// standby), but sometimes only at their next refresh, so a Delay near
	// RefreshInterval keeps the order. It adds to the fail-over time of a
	// lease when no instance is below its share (see the package doc). Zero
	// means RefreshInterval.
	Delay time.Duration

	// ShedAfter is how long an instance must have been above its fair share,
	// with somebody below it, before it gives up leases: the hysteresis that
	// keeps a briefly wrong view (an instance that just crashed and is still
	// counted) from moving leases. Keep it above the backend's TTL plus
	// RefreshInterval. Zero means 3 × RefreshInterval.
	ShedAfter time.Duration

	// RetryMin and RetryMax bound the exponential back-off (with jitter)
	// before campaigning again for a lease after a campaign failed because
	// the backend was unavailable, or after its Func returned an error:
	// baton.Backoff's Min and Max. Zero means baton.DefaultRetryMin (100 ms)
	// and baton.DefaultRetryMax (10 s).
	RetryMin, RetryMax time.Duration

	// StopEarly ends a Func's context this long before the term's safe-until
	// deadline when renewals lag, as baton.ElectorConfig.StopEarly does, with
	// the same cause (an error wrapping baton.ErrStoppedEarly). Zero means at
	// safe-until.
	StopEarly time.Duration

	// ResignTimeout bounds the release of a lease after its Func returned.
	// Zero means baton.DefaultResignTimeout (5 s). A release that times out
	// is logged; the lease then expires after its TTL.
	ResignTimeout time.Duration

	// Logger receives the Group's log lines (group "balance"). Nil means
	// silent.
	Logger *slog.Logger
}

// withDefaults fills in defaults, or returns a *baton.ConfigError naming
// every problem.
func (c Config) withDefaults() (Config, error) {
	var problems []string
	if c.Group == "" {
		problems = append(problems, `Group is empty: name the group of instances, such as "reports"`)
	}
	if strings.Contains(c.Group, "/") {
		problems = append(problems, fmt.Sprintf(`Group (%q) must not contain "/": etcd and ZooKeeper reject it in lease names`, c.Group))
	}
	if c.MaxMembers < 0 {
		problems = append(problems, fmt.Sprintf("MaxMembers (%d) must be positive, or zero for %d", c.MaxMembers, DefaultMaxMembers))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"RefreshInterval", c.RefreshInterval}, {"Delay", c.Delay}, {"ShedAfter", c.ShedAfter},
		{"RetryMin", c.RetryMin}, {"RetryMax", c.RetryMax}, {"StopEarly", c.StopEarly}, {"ResignTimeout", c.ResignTimeout},
	} {
		if d.v < 0 {
			problems = append(problems, fmt.Sprintf("%s (%s) must not be negative: zero means the default", d.name, d.v))
		}
	}
	if len(problems) > 0 {
		return c, &baton.ConfigError{Problems: problems}
	}
	if c.Candidate.ID == "" {
		c.Candidate.ID = baton.NewCandidateID()
	}
	if c.MaxMembers == 0 {
		c.MaxMembers = DefaultMaxMembers
	}
	if c.RefreshInterval == 0 {
		c.RefreshInterval = DefaultRefreshInterval
	}
	if c.Delay == 0 {
		c.Delay = c.RefreshInterval
	}
	if c.ShedAfter == 0 {
		c.ShedAfter = 3 * c.RefreshInterval
	}
	if c.ResignTimeout == 0 {
		c.ResignTimeout = baton.DefaultResignTimeout // also for the member slots
	}
	return c, nil
}

// Group runs a set of named leases in this instance and spreads their
// leadership over the instances of the group. Create it with New, add leases
// with Add, and call Run. Its methods are safe for concurrent use; Run may
// be active at most once at a time.
type Group struct {
	b          baton.Backend
	cfg        Config
	log        *slog.Logger
	prefix     string // of the member slot names
	loadPrefix string // of the load slot names

	running atomic.Bool
	jobWG   sync.WaitGroup // job loops started by Run or by Add during Run

	mu      sync.Mutex
	jobs    map[string]*job
	runCtx  context.Context         // non-nil while Run is active
	stopRun context.CancelCauseFunc // ends Run with a cause
	changed chan struct{}           // closed and replaced on every state change

	// The view, refreshed by the refresher. A view still growing is acted
	// on only once the next member scan agrees (see setView).
	ready       bool                 // a member view has been acted on since Run began
	members     map[string]struct{}  // IDs holding a member slot, and ours: the view acted on
	scanned     map[string]struct{}  // the members the last scan read, ours included
	fewSince    time.Time            // since when scans count less than half the members acted on (see setView)
	ring        []ringPoint          // the members on the standby ring (see standbyLocked)
	slot        int                  // our member slot, -1 when none
	loads       map[string]int       // the load each other member published, when known
	unknown     map[string]time.Time // since when a member's load has been unknown
	counts      map[string]int       // leases led by each other member: published, else scanned
	short       time.Time            // since when the loads have not accounted for every lease
	eagerOthers bool                 // another member published a load below floor(leases/N)
	sample      int                  // the least number of leases not led that the next full read samples
	readCap     int                  // the most that the next full read samples, 0 for no cap (see scanLeases)

	load      int            // leases we lead (admitted terms)
	gained    time.Time      // when we last admitted a term
	overSince time.Time      // when the shed condition began to hold
	backoff   int            // multiplier of ShedAfter, 1 … maxShedBackoff
	sheds     map[string]int // leases we shed → our load after shedding, until we see who took them
}

// job is one lease of the Group.
type job struct {
	name string
	fn   Func

	// The job's loop, while it has one (see wakeLocked); under Group.mu.
	running bool
	stop    context.CancelCauseFunc // ends the job loop; nil without one
	done    chan struct{}           // closed when the job loop returned
	// campaigning cancels the loop's open campaign, nil without one: a
	// broadcast after which the stance no longer wants it ends it.
	campaigning context.CancelCauseFunc
	// bo paces the job's campaigns and retries; only its loop uses it, and
	// it outlives a parked loop so that a failing lease keeps backing off.
	bo baton.Backoff

	// Guarded by Group.mu.
	term      baton.Term
	since     time.Time               // when the current term was admitted
	endLead   context.CancelCauseFunc // cancels the current Func (shedding)
	unsure    bool                    // we gave it up and have not read its holder since
	standby   bool                    // we are one of its ring members (see standbyLocked)
	holder    string                  // holder at the last read, "" when free
	freeSince time.Time               // since when the lease has looked without a live holder
	freeReads int                     // reads in a row that saw it without a live holder
	lastErr   error
}

// New returns a Group campaigning on b. The Backend is the caller's: the Group
// never closes it.
func New(b baton.Backend, cfg Config) (*Group, error) {
	cfg, err := cfg.withDefaults()
	if b == nil {
		p := "Backend is nil: pass a backend such as memory.New(...) or etcd.New(...)"
		var ce *baton.ConfigError
		if errors.As(err, &ce) {
			ce.Problems = append(ce.Problems, p)
		} else {
			err = &baton.ConfigError{Problems: []string{p}}
		}
	}
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Group{
		b:          b,
		cfg:        cfg,
		log:        log.WithGroup("balance").With("group", cfg.Group, "id", cfg.Candidate.ID),
		prefix:     cfg.Group + ".member-",
		loadPrefix: cfg.Group + ".load-",
		jobs:       map[string]*job{},
		changed:    make(chan struct{}),
		slot:       -1,
		backoff:    1,
		sheds:      map[string]int{},
	}, nil
}

// ID returns the candidate ID the Group campaigns with.
func (g *Group) ID() string { return g.cfg.Candidate.ID }

// Add adds the lease name, led by fn. It may be called before or during Run;
// during Run the Group starts campaigning for it at once. Every instance of
// the group should run the same set of leases.
func (g *Group) Add(name string, fn Func) error {
	switch {
	case name == "":
		return errors.New("balance: lease name is empty")
	case fn == nil:
		return fmt.Errorf("balance: Func for lease %q is nil", name)
	case strings.HasPrefix(name, g.prefix):
		return fmt.Errorf("balance: lease name %q is reserved for the group's member slots (prefix %q)", name, g.prefix)
	case strings.HasPrefix(name, g.loadPrefix):
		return fmt.Errorf("balance: lease name %q is reserved for the group's load slots (prefix %q)", name, g.loadPrefix)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.jobs[name]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicate, name)
	}
	j := &job{name: name, fn: fn, bo: baton.Backoff{Min: g.cfg.RetryMin, Max: g.cfg.RetryMax}}
	g.jobs[name] = j
	j.standby = g.standbyLocked(name)
	g.broadcastLocked() // starts its loop if it should campaign
	return nil
}

// Remove stops running the lease name: it stops campaigning for it and, if
// this instance leads it, cancels its Func, waits for it to return and
// resigns the lease. It returns ctx's error if ctx ends first; the lease is
// then released in the background, and Run waits for that.
func (g *Group) Remove(ctx context.Context, name string) error {
	g.mu.Lock()
	j, ok := g.jobs[name]
	if !ok {
		g.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrUnknownLease, name)
	}
	delete(g.jobs, name)
	delete(g.sheds, name)
	stop, done := j.stop, j.done
	g.broadcastLocked()
	g.mu.Unlock()
	if stop == nil {
		return nil // no loop: not campaigning, not leading
	}
	stop(errRemoved)
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run runs the Group until ctx ends: it takes a member slot, campaigns for
// the leases, runs their Funcs while it leads them, and balances. On the way
// out it cancels every Func, waits for them, resigns their leases, and then
// gives up its member slot, so that the other instances take over at once.
// It returns ctx's error, an error wrapping baton.ErrClosed when the
// Backend was closed under it, or a campaign's error matching
// *baton.ConfigError (a configuration the backend refuses, which no retry
// fixes), as baton.Elector.Run does. Func errors are logged and retried, never
// returned: one failing lease does not stop the others.
func (g *Group) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer g.running.Store(false)

	rctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	// The refresher outlives the job loops, so that the member slot is
	// resigned only after the leases.
	refCtx, refStop := context.WithCancel(context.WithoutCancel(ctx))
	defer refStop()

	g.mu.Lock()
	g.runCtx, g.stopRun = rctx, stop
	g.wakeLocked()
	g.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() { g.refresh(refCtx) })
	<-rctx.Done()

	g.mu.Lock()
	g.runCtx, g.stopRun = nil, nil
	g.mu.Unlock()
	g.jobWG.Wait() // every Func returned and every lease was resigned
	refStop()
	wg.Wait()

	if err := ctx.Err(); err != nil {
		return err
	}
	return context.Cause(rctx)
}

// fail ends Run with err (the Backend was closed).
func (g *Group) fail(err error) {
	g.mu.Lock()
	if g.stopRun != nil {
		g.stopRun(err)
	}
	g.mu.Unlock()
}

// startLocked starts j's job loop under the running Run.
func (g *Group) startLocked(j *job) {
	jctx, stop := context.WithCancelCause(g.runCtx)
	done := make(chan struct{})
	j.running, j.stop, j.done = true, stop, done
	g.jobWG.Add(1)
	go func() {
		defer g.jobWG.Done()
		defer close(done)
		defer stop(nil) // a parked loop's context must not stay a child of Run's
		if !g.runJob(jctx, j) {
			g.mu.Lock()
			j.running, j.stop, j.done = false, nil, nil
			g.mu.Unlock()
		}
	}()
}

// wakeLocked starts the loop of every job without one whose stance wants a
// campaign now or changes at a known time, and cancels the open campaigns
// it no longer wants. A job loop exists only while its lease is led,
// campaigned for or waited on (see runJob), so that an instance's
// goroutines grow with the leases it leads and stands by for, not with
// every lease of the group (a loop per lease in every instance would make
// 10,000 leases over 100 instances a million loops). A stance changes only with the view or the
// load, which is when broadcastLocked calls this, or at a time a waiting
// loop knows; a wanted campaign stays wanted as time passes.
func (g *Group) wakeLocked() {
	if g.runCtx == nil || g.runCtx.Err() != nil {
		return
	}
	now := time.Now()
	for _, j := range g.jobs {
		switch {
		case j.campaigning != nil:
			if want, _ := g.stanceLocked(j, now); !want {
				j.campaigning(errStance)
				j.campaigning = nil
			}
		case !j.running:
			if want, at := g.stanceLocked(j, now); want || !at.IsZero() {
				g.startLocked(j)
			}
		}
	}
}

// broadcastLocked wakes everybody waiting for a change of the view or load,
// and starts the loops of the jobs that now want one.
func (g *Group) broadcastLocked() {
	close(g.changed)
	g.changed = make(chan struct{})
	g.wakeLocked()
}

// shareLocked returns floor and ceil of leases per member.
func (g *Group) shareLocked() (lo, hi int) {
	l, n := len(g.jobs), max(len(g.members), 1)
	return l / n, (l + n - 1) / n
}

// Status is a snapshot of a Group's state.
type Status struct {
	// ID is the candidate ID.
	ID string
	// Slot is the member slot this instance holds, or -1.
	Slot int
	// Members is N, the number of instances counted at the last refresh
	// (this one included); zero before the first refresh.
	Members int
	// Leases is the number of leases added to the Group.
	Leases int
	// Share is the fair share ceil(Leases/Members); zero before the first
	// refresh.
	Share int
	// Leading lists the leases this instance leads now, sorted.
	Leading []string
	// Errors holds, by lease name, the last error of a lease's Func or
	// campaign, for leases that have one.
	Errors map[string]error
}

// Status returns a snapshot of the Group's state.
func (g *Group) Status() Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := Status{ID: g.cfg.Candidate.ID, Slot: g.slot, Leases: len(g.jobs)}
	if g.ready {
		s.Members = len(g.members)
		_, s.Share = g.shareLocked()
	}
	for name, j := range g.jobs {
		if j.term != nil && g.live(j.term) {
			s.Leading = append(s.Leading, name)
		}
		if j.lastErr != nil {
			if s.Errors == nil {
				s.Errors = map[string]error{}
			}
			s.Errors[name] = j.lastErr
		}
	}
	slices.Sort(s.Leading)
	return s
}

// IsLeader reports whether this instance leads the lease name now: it holds
// the term and is before its safe-until deadline (less StopEarly). It does not
// contact the backend.
func (g *Group) IsLeader(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	j := g.jobs[name]
	return j != nil && j.term != nil && g.live(j.term)
}

// live reports whether t is running and before its deadline.
func (g *Group) live(t baton.Term) bool {
	select {
	case <-t.Done():
		return false
	default:
	}
	return time.Now().Before(t.SafeUntil().Add(-g.cfg.StopEarly))
}

// resign releases t, bounded by ResignTimeout even when ctx has ended.
func (g *Group) resign(ctx context.Context, t baton.Term) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.ResignTimeout)
	defer cancel()
	if err := t.Resign(rctx); err != nil {
		g.log.Warn("releasing a lease failed; it will expire after its TTL", "lease", t.Lease(), "token", t.Token(), "err", err)
	}
}
