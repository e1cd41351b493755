// Package harness runs a chaos run: a real backend, N `baton run`
// candidates whose children write to a fenced store, and a nemesis that
// injects faults at random times from a seed. The checker (package check)
// reads what the run recorded.
package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton/chaos/internal/check"
	"github.com/batonhq/baton/chaos/internal/record"
	"github.com/batonhq/baton/chaos/internal/store"
	"github.com/batonhq/baton/chaos/internal/turns"
)

// Config is a chaos run's settings. The zero value of each field but
// Backend, Dir and Child is replaced by its default (see WithDefaults).
type Config struct {
	// Backend is one of Backends.
	Backend string
	// PgBouncer sends the postgres backend's candidates through a real
	// PgBouncer in transaction-pooling mode (each candidate's proxy in
	// front of it), where LISTEN cannot work and waiters poll.
	PgBouncer bool
	// Candidates is the number of `baton run` candidates (3).
	Candidates int
	// Faults is the number of faults to inject (30).
	Faults int
	// Interval is the mean time between two injections, drawn from an
	// exponential distribution (2s).
	Interval time.Duration
	// MaxActive is how many faults may be in force at once (2): faults
	// overlap, as they do in production.
	MaxActive int
	// Kinds are the fault kinds to inject, chosen uniformly; nil means
	// every kind the backend supports but KindWipe, which is opt-in.
	Kinds []string
	// TTL is the candidates' --ttl (3s); Grace their --grace (0: baton's
	// default).
	TTL   time.Duration
	Grace time.Duration
	// Heartbeat is how often each child writes to the store (20ms).
	Heartbeat time.Duration
	// Seed seeds the nemesis's schedule.
	Seed int64
	// Broken names a deliberately broken baton build, one of BrokenBuilds,
	// or "".
	Broken string
	// Dir is the run's directory: the store's socket, the backend's data,
	// the candidates' logs. It must exist.
	Dir string
	// Baton is the baton binary; "" builds it from the module in the
	// working directory (with Broken's build tag).
	Baton string
	// Turns is the number of candidates per process (1): above 1, each
	// candidate process is `baton-chaos turns` (package turns) with Turns
	// Electors on one Backend, ids "cK-1" to "cK-Turns", which take turns
	// in the process, and whose terms end on their own after up to
	// TermMax (4 × TTL), handing the lease over.
	Turns int
	// TermMax bounds a term's length in a run with Turns above 1.
	TermMax time.Duration
	// Child is the command line of the children's writer, to which the
	// harness adds --store, --candidate and --every (see ChildMain).
	Child []string
	// Command is the command line that reproduces the run, for the record.
	Command string
	// Log receives the harness's progress; nil discards it.
	Log *slog.Logger
}

// BrokenBuilds are the deliberately broken baton builds, and the build tag
// of each: a candidate that ignores its deadline, and one that hands its
// command stale tokens. A run on one of them must fail the check.
var BrokenBuilds = map[string]string{
	"ignore-deadline": "batonchaos_ignoredeadline",
	"stale-token":     "batonchaos_staletoken",
}

// WithDefaults returns c with each zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Candidates == 0 {
		c.Candidates = 3
	}
	if c.Faults == 0 {
		c.Faults = 30
	}
	if c.Interval == 0 {
		c.Interval = 2 * time.Second
	}
	if c.MaxActive == 0 {
		c.MaxActive = 2
	}
	if c.TTL == 0 {
		c.TTL = 3 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 20 * time.Millisecond
	}
	if c.Turns == 0 {
		c.Turns = 1
	}
	if c.TermMax == 0 {
		c.TermMax = 4 * c.TTL
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// backendName is the backend's name in the record: Backend, with
// "+pgbouncer" when the candidates go through PgBouncer.
func (c Config) backendName() string {
	if c.PgBouncer {
		return c.Backend + "+pgbouncer"
	}
	return c.Backend
}

// Validate returns every problem with c, each saying how to fix it.
func (c Config) Validate() error {
	var errs []error
	if !slices.Contains(Backends, c.Backend) {
		errs = append(errs, fmt.Errorf("backend %q: want one of %s", c.Backend, strings.Join(Backends, ", ")))
	}
	if c.Candidates < 2 {
		errs = append(errs, fmt.Errorf("candidates %d: want at least 2 (one leads, one waits)", c.Candidates))
	}
	if c.PgBouncer && c.Backend != "postgres" {
		errs = append(errs, fmt.Errorf("pgbouncer: only the postgres backend goes through PgBouncer, not %s; drop --pgbouncer", c.Backend))
	}
	if c.Backend == "raft" && c.Candidates < 3 {
		errs = append(errs, fmt.Errorf("candidates %d: raft needs at least 3 (its voters)", c.Candidates))
	}
	if c.Faults < 0 || c.Interval <= 0 || c.MaxActive < 1 {
		errs = append(errs, fmt.Errorf("faults %d, interval %s, max-active %d: want faults ≥ 0, a positive interval and max-active ≥ 1", c.Faults, c.Interval, c.MaxActive))
	}
	if c.TTL < time.Second {
		errs = append(errs, fmt.Errorf("ttl %s: want at least 1s (the backends' lease granularity)", c.TTL))
	}
	if c.Heartbeat <= 0 || c.Heartbeat > c.TTL/10 {
		errs = append(errs, fmt.Errorf("heartbeat %s: want a positive duration of at most a tenth of the TTL", c.Heartbeat))
	}
	if c.Turns < 1 || c.TermMax < 0 {
		errs = append(errs, fmt.Errorf("turns %d, term-max %s: want 1 or more candidates per process and a term-max ≥ 0", c.Turns, c.TermMax))
	}
	if c.Turns > 1 {
		if !slices.Contains(turns.Schemes, c.Backend) || c.PgBouncer || c.Broken != "" {
			errs = append(errs, fmt.Errorf("turns %d: a process with several candidates runs on %s only (no PgBouncer, no broken build)", c.Turns, strings.Join(turns.Schemes, ", ")))
		}
		for _, k := range c.Kinds {
			if k == KindStopBaton || k == KindStall {
				errs = append(errs, fmt.Errorf("fault kind %q: with turns the work runs in the candidate's process, which has no guard; use stop-tree", k))
			}
		}
	}
	supported := KindsOf(c.Backend)
	for _, k := range c.Kinds {
		if !slices.Contains(supported, k) {
			errs = append(errs, fmt.Errorf("fault kind %q: the %s backend takes %s", k, c.Backend, strings.Join(supported, ", ")))
		}
	}
	if _, ok := BrokenBuilds[c.Broken]; c.Broken != "" && !ok {
		errs = append(errs, fmt.Errorf("broken build %q: want ignore-deadline or stale-token", c.Broken))
	}
	if c.Broken != "" && c.Baton != "" {
		errs = append(errs, errors.New("a broken build is built by the harness: do not give a baton binary with it"))
	}
	if len(c.Child) == 0 {
		errs = append(errs, errors.New("no child command"))
	}
	if c.Dir == "" {
		errs = append(errs, errors.New("no run directory"))
	}
	return errors.Join(errs...)
}

// Harness is one chaos run in progress.
type Harness struct {
	cfg   Config
	log   *slog.Logger
	t0    time.Time
	be    backend
	st    *store.Store
	sock  string
	wlog  *os.File
	baton string
	cands []*candidate

	mu          sync.Mutex
	faults      []record.Fault
	raftLeader  int // index of the candidate that last became raft leader, -1 if unknown
	backendBusy bool
	hogBusy     bool
	closing     bool
	exits       []string // candidates' exits that were not the harness's doing
}

// exitedByItself records that c's baton exited without the harness asking
// (a crash, or an error exit), and starts it again unless a fault holds it
// (the fault restarts it) or the run is ending.
func (h *Harness) exitedByItself(c *candidate, status string) {
	h.mu.Lock()
	closing := h.closing
	if !closing {
		h.exits = append(h.exits, fmt.Sprintf("%s: %s at %s", c.id, status, h.now().Round(time.Millisecond)))
	}
	h.mu.Unlock()
	if closing {
		return
	}
	h.log.Warn("a candidate exited by itself; restarting it (its log says why)", "candidate", c.id, "status", status)
	// A fault may hold the candidate (it was picked in the moment before
	// the exit); wait for it to let go, then start the candidate unless
	// the fault did.
	for !c.claim() {
		time.Sleep(100 * time.Millisecond)
	}
	defer c.release()
	time.Sleep(time.Second)
	if pid, _ := c.proc(); pid != 0 {
		return
	}
	if err := c.start(); err != nil && !errors.Is(err, errClosing) {
		h.log.Error("could not restart the candidate", "candidate", c.id, "err", err)
	}
}

// now is the run's clock: the time since it started, monotonic.
func (h *Harness) now() time.Duration { return time.Since(h.t0) }

func (h *Harness) setRaftLeader(i int) {
	h.mu.Lock()
	h.raftLeader = i
	h.mu.Unlock()
}

// Run runs a chaos run and returns what it recorded. The history is
// returned, as far as it goes, with an error too: a run cut short by ctx
// can still be checked.
func Run(ctx context.Context, cfg Config) (record.History, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return record.History{}, err
	}
	h := &Harness{cfg: cfg, log: cfg.Log, raftLeader: -1}
	defer h.cleanup()
	if err := h.setup(ctx); err != nil {
		return h.history(), err
	}
	err := h.nemesis(ctx)
	if ctx.Err() == nil {
		h.settle()
	}
	h.stopCandidates()
	return h.history(), err
}

func (h *Harness) setup(ctx context.Context) error {
	h.baton = h.cfg.Baton
	if h.baton == "" {
		bin, err := buildBaton(ctx, h.cfg.Dir, BrokenBuilds[h.cfg.Broken])
		if err != nil {
			return err
		}
		h.baton = bin
	}
	h.t0 = time.Now()
	// Every write is also streamed to writes.jsonl, so that a harness
	// that dies still leaves its history.
	wlog, err := os.Create(filepath.Join(h.cfg.Dir, "writes.jsonl"))
	if err != nil {
		return err
	}
	h.wlog = wlog
	h.st = store.New(h.now, store.WithLog(wlog))
	h.sock = filepath.Join(h.cfg.Dir, "store.sock")
	_ = os.Remove(h.sock)
	ln, err := net.Listen("unix", h.sock)
	if err != nil {
		return fmt.Errorf("fenced store: %w", err)
	}
	go func() { _ = h.st.Serve(ln) }()

	be, err := newBackend(h.cfg.Backend, h.cfg.Dir, h.cfg.Candidates)
	if err != nil {
		return err
	}
	if pb, ok := be.(*pgBackend); ok {
		pb.bouncer = h.cfg.PgBouncer
	}
	h.be = be
	h.log.Info("starting the backend", "backend", h.cfg.Backend)
	if err := be.start(); err != nil {
		return err
	}
	for i := range h.cfg.Candidates {
		id := fmt.Sprintf("c%d", i+1)
		f, err := os.OpenFile(filepath.Join(h.cfg.Dir, id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		c := &candidate{id: id, i: i, h: h, log: f}
		h.cands = append(h.cands, c)
		if err := c.start(); err != nil {
			return err
		}
	}
	h.log.Info("waiting for the first leader", "candidates", h.cfg.Candidates)
	switch err := h.awaitLeader(ctx, 2*time.Minute, h.flagsRefused); {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no candidate led within 2m of the start (see the candidates' logs in %s): %w", h.cfg.Dir, err)
	case err != nil:
		return err
	}
	return nil
}

// flagsRefused reports, before any candidate led, that every candidate
// exited with status 2, baton's exit for bad flags: the run's settings
// (its --ttl below the backend's floor, say) cannot work, and restarting
// the candidates will not change that. The error quotes the first
// candidate's last line from baton.
func (h *Harness) flagsRefused() error {
	h.mu.Lock()
	refused := map[string]bool{}
	for _, e := range h.exits {
		if id, rest, ok := strings.Cut(e, ": "); ok && strings.HasPrefix(rest, "exit status 2 ") {
			refused[id] = true
		}
	}
	h.mu.Unlock()
	for _, c := range h.cands {
		if !refused[c.id] {
			return nil
		}
	}
	why := "see its log"
	if b, err := os.ReadFile(filepath.Join(h.cfg.Dir, h.cands[0].id+".log")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "baton: ") {
				why = strings.TrimPrefix(line, "baton: ")
			}
		}
	}
	return fmt.Errorf("every candidate exited with status 2 (baton refused its flags) before any led: %s: %s", h.cands[0].id, why)
}

// buildBaton builds ./cmd/baton of the module in the working directory
// into dir, with tags.
func buildBaton(ctx context.Context, dir, tags string) (string, error) {
	bin := filepath.Join(dir, "baton")
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "github.com/batonhq/baton/cmd/baton")
	cmd := exec.CommandContext(ctx, "go", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build baton (run baton-chaos from the baton repository, or give --baton): %v\n%s", err, out)
	}
	return bin, nil
}

// holder returns the candidate whose child made the last accepted write,
// if that was within a few heartbeats.
func (h *Harness) holder() *candidate {
	w, ok := h.st.Last()
	if !ok || h.now()-w.At > 5*h.cfg.Heartbeat+100*time.Millisecond {
		return nil
	}
	for _, c := range h.cands {
		if c.id == check.ProcessOf(w.Candidate) {
			return c
		}
	}
	return nil
}

// awaitLeader waits until some child writes and is accepted, for at most
// d; hopeless, if not nil, is asked at each heartbeat whether waiting is
// pointless, and its error ends the wait.
func (h *Harness) awaitLeader(ctx context.Context, d time.Duration, hopeless func() error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	tick := time.NewTicker(h.cfg.Heartbeat)
	defer tick.Stop()
	for h.holder() == nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if hopeless != nil {
			if err := hopeless(); err != nil {
				return err
			}
		}
	}
	return nil
}

// settle waits, after the last fault, for a leader again, so that the
// last fault's recovery is part of the record.
func (h *Harness) settle() {
	if h.st == nil || len(h.cands) == 0 {
		return
	}
	if err := h.awaitLeader(context.Background(), h.cfg.TTL*4+30*time.Second, nil); err != nil {
		h.log.Warn("no leader after the last fault", "err", err)
	}
	// A few more heartbeats, so the last leader's run is not a point.
	time.Sleep(10 * h.cfg.Heartbeat)
}

// stopCandidates stops every candidate gracefully.
func (h *Harness) stopCandidates() {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range h.cands {
		wg.Go(func() {
			if !c.stop(syscall.SIGTERM, h.cfg.TTL+30*time.Second) {
				h.log.Warn("candidate did not stop on SIGTERM; killed", "candidate", c.id)
			}
		})
	}
	wg.Wait()
}

func (h *Harness) cleanup() {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	for _, c := range h.cands {
		c.stop(syscall.SIGKILL, 10*time.Second)
		_ = c.log.Close()
	}
	if h.be != nil {
		h.be.close()
	}
	if h.st != nil {
		_ = h.st.Close()
	}
	if h.wlog != nil {
		_ = h.wlog.Close()
	}
}

// history returns what the run recorded so far.
func (h *Harness) history() record.History {
	hist := record.History{Run: record.Run{
		Backend:        h.cfg.backendName(),
		Seed:           h.cfg.Seed,
		Command:        h.cfg.Command,
		Candidates:     h.cfg.Candidates,
		TTL:            h.cfg.TTL,
		Grace:          h.cfg.Grace,
		Heartbeat:      h.cfg.Heartbeat,
		RecoveryBudget: RecoveryBudget(h.cfg.TTL),
		Broken:         h.cfg.Broken,
		Started:        h.t0,
	}}
	if h.st != nil {
		hist.Writes = h.st.Writes()
		hist.Run.Duration = h.now()
	}
	h.mu.Lock()
	hist.Faults = slices.Clone(h.faults)
	hist.Exits = slices.Clone(h.exits)
	h.mu.Unlock()
	return hist
}

// RecoveryBudget is how long after a fault ends a run may be without a
// leader before the time counts against availability: the time for a
// lease left by a stopped holder to expire (TTL) and for a standby to take
// it, plus a restarted backend's or group's start-up and session set-up.
func RecoveryBudget(ttl time.Duration) time.Duration { return 2*ttl + 10*time.Second }
