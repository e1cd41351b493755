package gocronbaton_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/gocronbaton"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/go-co-op/gocron/v2"
)

// A one-second TTL with a wide drift margin: a holder that stops renewing
// has stopped acting well before anybody takes over, even under load.
var testTiming = backend.Config{TTL: time.Second, RenewInterval: 200 * time.Millisecond, DriftMargin: 300 * time.Millisecond}

// run is one execution of a job, as the job itself saw it.
type run struct {
	id         string
	token      uint64 // 0 when the job did not get a term
	slot       time.Time
	start, end time.Time
}

// journal records the runs of all simulated processes.
type journal struct {
	mu   sync.Mutex
	runs []run
}

func (j *journal) add(r run) {
	j.mu.Lock()
	j.runs = append(j.runs, r)
	j.mu.Unlock()
}

func (j *journal) snapshot() []run {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.runs)
}

// await polls until cond holds on the journal, or fails after timeout.
func (j *journal) await(t *testing.T, timeout time.Duration, what string, cond func([]run) bool) {
	t.Helper()
	if !testkit.Poll(timeout, 20*time.Millisecond, func() bool { return cond(j.snapshot()) }) {
		t.Fatalf("timed out after %s waiting for %s; runs:\n%s", timeout, what, format(j.snapshot()))
	}
}

// checkNoOverlap fails the test if two runs were in progress at once.
func checkNoOverlap(t *testing.T, runs []run) {
	t.Helper()
	runs = slices.Clone(runs)
	slices.SortFunc(runs, func(a, b run) int { return a.start.Compare(b.start) })
	for i := 1; i < len(runs); i++ {
		if p, r := runs[i-1], runs[i]; r.start.Before(p.end) {
			t.Errorf("runs overlap: %s (token %d) started %s before %s (token %d) ended",
				r.id, r.token, p.end.Sub(r.start), p.id, p.token)
		}
	}
}

func format(runs []run) string {
	var b strings.Builder
	for _, r := range runs {
		fmt.Fprintf(&b, "  %s token=%d slot=%s start=%s took=%s\n", r.id, r.token, r.slot.Format("15:04:05"), r.start.Format("15:04:05.000"), r.end.Sub(r.start).Round(time.Millisecond))
	}
	return b.String()
}

func newBackend(t *testing.T, store *memory.Store) *memory.Backend {
	t.Helper()
	b, err := memory.New(store, memory.Options{Config: testTiming})
	if err != nil {
		t.Fatal(err)
	}
	return testkit.CloseAtEnd(t, b, 5*time.Second)
}

func newScheduler(t *testing.T, opts ...gocron.SchedulerOption) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// Three processes, each with a gocron scheduler running a job every second
// under an Elector: the job runs on one process at a time, across a graceful
// hand-over and across the leader being cut off.
func TestElectorOneProcessAtATime(t *testing.T) {
	store := memory.NewStore()
	var jr journal
	type process struct {
		b    *memory.Backend
		el   *gocronbaton.Elector
		stop context.CancelFunc
		done chan error
	}
	procs := map[string]*process{}
	for _, id := range []string{"a", "b", "c"} {
		b := newBackend(t, store)
		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "cron", Candidate: baton.Candidate{ID: id}, RetryMax: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		el, err := gocronbaton.NewElector(e, gocronbaton.ElectorOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := el.IsLeader(context.Background()); !errors.Is(err, gocronbaton.ErrNotLeader) {
			t.Fatalf("IsLeader before Run: %v, want ErrNotLeader", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		p := &process{b: b, el: el, stop: cancel, done: make(chan error, 1)}
		go func() { p.done <- el.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-p.done })
		procs[id] = p

		s := newScheduler(t, gocron.WithDistributedElector(el))
		_, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(el.Job(func(ctx context.Context, term baton.Term) error {
			r := run{id: id, token: term.Token(), start: time.Now()}
			if tt, ok := gocronbaton.TermFromContext(ctx); !ok || tt.Token() != term.Token() {
				t.Errorf("TermFromContext: %v, %v; want the run's term", tt, ok)
			}
			select { // the work: 300 ms, or less if the term ends
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
			}
			r.end = time.Now()
			jr.add(r)
			return nil
		})), gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartImmediately()))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
	}
	ranBy := func(runs []run, id string) int {
		n := 0
		for _, r := range runs {
			if r.id == id {
				n++
			}
		}
		return n
	}

	jr.await(t, 20*time.Second, "two runs", func(runs []run) bool { return len(runs) >= 2 })
	first := jr.snapshot()[0].id

	// Graceful hand-over: the leader stops campaigning. Its scheduler keeps
	// firing, but IsLeader now says no.
	procs[first].stop()
	if err := <-procs[first].done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	procs[first].done <- context.Canceled
	if err := procs[first].el.IsLeader(context.Background()); !errors.Is(err, gocronbaton.ErrNotLeader) {
		t.Errorf("IsLeader after Run returned: %v, want ErrNotLeader", err)
	}
	var second string
	jr.await(t, 20*time.Second, "a run on another process", func(runs []run) bool {
		for _, r := range runs {
			if r.id != first {
				second = r.id
				return ranBy(runs, second) >= 2
			}
		}
		return false
	})

	// The new leader is cut off: its term ends at safe-until, the third
	// process takes over after a TTL.
	before := ranBy(jr.snapshot(), first)
	procs[second].b.Disconnect()
	jr.await(t, 20*time.Second, "a run on the third process", func(runs []run) bool {
		for _, r := range runs {
			if r.id != first && r.id != second {
				return true
			}
		}
		return false
	})
	runs := jr.snapshot()
	if n := ranBy(runs, first); n != before {
		t.Errorf("%s ran %d more times after it stopped leading", first, n-before)
	}
	checkNoOverlap(t, runs)
	for i := 1; i < len(runs); i++ {
		if runs[i].token < runs[i-1].token {
			t.Errorf("tokens went backwards: %d after %d", runs[i].token, runs[i-1].token)
		}
	}
	t.Logf("runs:\n%s", format(runs))
}

// Three processes, each with a gocron scheduler and a Locker, run a job
// every second aligned to whole seconds: each second's run happens on one
// process only, and the runs go on when a process is cut off.
func TestLockerOneRunPerSlot(t *testing.T) {
	store := memory.NewStore()
	var jr journal
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	backends := map[string]*memory.Backend{}
	const hold = 300 * time.Millisecond // below the interval, so runs spread
	var locks lockJournal
	for _, id := range []string{"a", "b", "c"} {
		b := newBackend(t, store)
		backends[id] = b
		l, err := gocronbaton.NewLocker(b, gocronbaton.LockerOptions{
			Candidate: baton.Candidate{ID: id},
			Hold:      hold,
		})
		if err != nil {
			t.Fatal(err)
		}
		s := newScheduler(t, gocron.WithDistributedLocker(&recordingLocker{Locker: l, id: id, j: &locks}))
		t.Cleanup(func() { // after the scheduler's shutdown: cleanups run last-in first-out
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := l.Close(ctx); err != nil {
				t.Errorf("Locker.Close: %v", err)
			}
		})
		// A plain job function: the Locker needs no change to the job.
		_, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() {
			r := run{id: id, start: time.Now()}
			r.slot = r.start.Round(time.Second)
			time.Sleep(100 * time.Millisecond)
			r.end = time.Now()
			jr.add(r)
		}), gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartDateTime(start)))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
	}

	jr.await(t, 20*time.Second, "three runs", func(runs []run) bool { return len(runs) >= 3 })
	// Cut off the process that ran last: it cannot release what it holds.
	runs := jr.snapshot()
	victim := runs[len(runs)-1].id
	backends[victim].Disconnect()
	cut := time.Now()
	jr.await(t, 20*time.Second, "three runs after the cut", func(runs []run) bool {
		n := 0
		for _, r := range runs {
			if r.start.After(cut) {
				n++
				if r.id == victim {
					t.Errorf("the cut-off process ran slot %s", r.slot.Format("15:04:05"))
				}
			}
		}
		return n >= 3
	})
	runs = jr.snapshot()
	// One run per slot holds as long as the schedulers fire within Hold of
	// each other, which a loaded machine does not promise; what the Locker
	// promises is that a lock another instance took is held for Hold. So
	// two instances' locks are never taken less than Hold apart, measured
	// from before the earlier Lock call to after the later one returned.
	checkLocksHeld(t, locks.snapshot(), hold)
	slots := map[time.Time][]string{}
	for _, r := range runs {
		slots[r.slot] = append(slots[r.slot], r.id)
	}
	for slot, ids := range slots {
		if len(ids) > 1 {
			t.Logf("slot %s ran on %v: a scheduler fired more than Hold late", slot.Format("15:04:05"), ids)
		}
	}
	checkNoOverlap(t, runs)
	t.Logf("runs:\n%s", format(runs))
}

// lockAt is one Lock call that returned a lock: the lease was taken (or a
// lock still held reused) between called and returned.
type lockAt struct {
	id               string
	called, returned time.Time
}

type lockJournal struct {
	mu    sync.Mutex
	locks []lockAt
}

func (j *lockJournal) snapshot() []lockAt {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.locks)
}

// recordingLocker is a gocron.Locker that notes when each successful Lock
// of the Locker it wraps was called and returned.
type recordingLocker struct {
	*gocronbaton.Locker
	id string
	j  *lockJournal
}

func (r *recordingLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	called := time.Now()
	lk, err := r.Locker.Lock(ctx, key)
	if err == nil {
		r.j.mu.Lock()
		r.j.locks = append(r.j.locks, lockAt{id: r.id, called: called, returned: time.Now()})
		r.j.mu.Unlock()
	}
	return lk, err
}

// checkLocksHeld fails the test if an instance got a lock less than hold
// after another instance's Lock call that got it: the lease was then taken
// twice within Hold.
func checkLocksHeld(t *testing.T, locks []lockAt, hold time.Duration) {
	t.Helper()
	slices.SortFunc(locks, func(a, b lockAt) int { return a.called.Compare(b.called) })
	for i, a := range locks {
		for _, b := range locks[i+1:] {
			if b.id != a.id && b.returned.Before(a.called.Add(hold)) {
				t.Errorf("%s got the lock at %s, and %s at %s, less than Hold (%s) later",
					a.id, a.called.Format("15:04:05.000"), b.id, b.returned.Format("15:04:05.000"), hold)
			}
		}
	}
}

// Locker semantics without a scheduler: fail fast when held elsewhere, one
// run per instance, Hold, reuse, ErrLockLost, the Job wrapper.
func TestLockerSemantics(t *testing.T) {
	store := memory.NewStore()
	ba, bb := newBackend(t, store), newBackend(t, store)
	la, _ := gocronbaton.NewLocker(ba, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: "a"}, Hold: 200 * time.Millisecond})
	lb, _ := gocronbaton.NewLocker(bb, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: "b"}, Hold: 200 * time.Millisecond, Prefix: "cron."})
	defer la.Close(context.Background())
	defer lb.Close(context.Background())
	ctx := context.Background()

	lk, err := la.Lock(ctx, "pkg/job")
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := ba.Leader(ctx, "pkg%2Fjob"); err != nil || rec.Holder != "a" {
		t.Fatalf("lease pkg%%2Fjob: %v, %v; want held by a", rec, err)
	}
	if _, err := la.Lock(ctx, "pkg/job"); !errors.Is(err, gocronbaton.ErrLocked) {
		t.Errorf("second Lock in the same instance: %v, want ErrLocked", err)
	}
	// The Job wrapper sees the lock's term.
	var token uint64
	err = la.Job("pkg/job", func(ctx context.Context, term baton.Term) error {
		token = term.Token()
		return nil
	})(ctx)
	if err != nil || token == 0 {
		t.Errorf("Job: %v, token %d", err, token)
	}
	if err := la.Job("other", func(context.Context, baton.Term) error { return nil })(ctx); !errors.Is(err, gocronbaton.ErrNotLocked) {
		t.Errorf("Job without its lock: %v, want ErrNotLocked", err)
	}
	// Another instance on the same lease name fails fast.
	lc, _ := gocronbaton.NewLocker(bb, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: "c"}, Wait: time.Minute, Hold: 2 * time.Minute})
	defer lc.Close(ctx)
	began := time.Now()
	if _, err := lc.Lock(ctx, "pkg/job"); !errors.Is(err, gocronbaton.ErrLocked) {
		t.Errorf("Lock held elsewhere: %v, want ErrLocked", err)
	} else if time.Since(began) > 30*time.Second {
		t.Errorf("Lock held elsewhere waited %s: it should fail without waiting for Wait", time.Since(began))
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	// Within Hold, a new Lock of the same instance reuses the lease.
	lk2, err := la.Lock(ctx, "pkg/job")
	if err != nil {
		t.Fatalf("Lock again within Hold: %v", err)
	}
	_ = lk2.Unlock(ctx)
	// After Hold the lease is released, and another instance gets it.
	testkit.Eventually(t, 10*time.Second, "the lease released after Hold", func() bool {
		_, err := ba.Leader(ctx, "pkg%2Fjob")
		return errors.Is(err, baton.ErrNoLeader)
	})
	lk3, err := lc.Lock(ctx, "pkg/job")
	if err != nil {
		t.Fatalf("Lock after release: %v", err)
	}
	// The term ends under the run: Unlock reports it.
	bb.Disconnect()
	testkit.EventuallyErr(t, 10*time.Second, "Unlock to report the expired term", func() error {
		err := lk3.Unlock(ctx)
		if errors.Is(err, gocronbaton.ErrLockLost) && errors.Is(err, baton.ErrExpired) {
			return nil
		}
		return fmt.Errorf("Unlock after the term expired: %v, want ErrLockLost wrapping ErrExpired", err)
	})
	bb.Reconnect()
	// The prefix is applied.
	lk4, err := lb.Lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := bb.Leader(ctx, "cron.x"); err != nil || rec.Holder != "b" {
		t.Errorf("lease cron.x: %v, %v; want held by b", rec, err)
	}
	_ = lk4.Unlock(ctx)
	if err := la.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := la.Lock(ctx, "y"); !errors.Is(err, baton.ErrClosed) {
		t.Errorf("Lock after Close: %v, want ErrClosed", err)
	}
}

// A holder that dies (never releases) is replaced: the standby left by a
// failed Lock watches the lease for a TTL and frees it.
func TestLockerTakesOverFromDeadHolder(t *testing.T) {
	store := memory.NewStore()
	ba, bb := newBackend(t, store), newBackend(t, store)
	la, _ := gocronbaton.NewLocker(ba, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: "a"}, Hold: time.Hour})
	lb, _ := gocronbaton.NewLocker(bb, gocronbaton.LockerOptions{Candidate: baton.Candidate{ID: "b"}})
	defer lb.Close(context.Background())
	ctx := context.Background()
	if _, err := la.Lock(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	ba.Disconnect() // a dies holding the lock
	defer la.Close(ctx)
	if _, err := lb.Lock(ctx, "job"); !errors.Is(err, gocronbaton.ErrLocked) {
		t.Fatalf("Lock while a holds it: %v, want ErrLocked", err)
	}
	var last error
	if !testkit.Poll(20*time.Second, 50*time.Millisecond, func() bool {
		lk, err := lb.Lock(ctx, "job")
		if err == nil {
			_ = lk.Unlock(ctx)
			return true
		}
		if !errors.Is(err, gocronbaton.ErrLocked) {
			t.Fatalf("Lock after the holder died: %v", err)
		}
		last = err
		return false
	}) {
		t.Fatalf("Lock after the holder died: %v", last)
	}
}

func TestConfigErrors(t *testing.T) {
	if _, err := gocronbaton.NewElector(nil, gocronbaton.ElectorOptions{MinRemaining: -1}); err == nil {
		t.Error("NewElector accepted a nil Elector")
	}
	var ce *baton.ConfigError
	if _, err := gocronbaton.NewLocker(nil, gocronbaton.LockerOptions{Wait: -1}); !errors.As(err, &ce) || len(ce.Problems) != 2 {
		t.Errorf("NewLocker: %v; want a ConfigError with two problems", err)
	}
	b := newBackend(t, memory.NewStore())
	if _, err := gocronbaton.NewLocker(b, gocronbaton.LockerOptions{Wait: time.Second, Hold: time.Second}); !errors.As(err, &ce) || !strings.Contains(err.Error(), "below Hold") {
		t.Errorf("NewLocker with Wait >= Hold: %v; want a ConfigError", err)
	}
}

// MinRemaining refuses a term whose safe-until is too close.
func TestElectorMinRemaining(t *testing.T) {
	b := newBackend(t, memory.NewStore())
	e, _ := baton.NewElector(b, baton.ElectorConfig{Lease: "cron"})
	el, _ := gocronbaton.NewElector(e, gocronbaton.ElectorOptions{MinRemaining: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if _, err := e.Await(ctx); err != nil {
		t.Fatal(err)
	}
	// Elected is not yet led: IsLeader says "not held by Lead yet" until
	// Run has called Lead on the term, which a busy machine may delay.
	var err error
	testkit.Eventually(t, 30*time.Second, "Lead to hold the term", func() bool {
		err = el.IsLeader(ctx)
		return err == nil || !strings.Contains(err.Error(), "not held by Lead yet")
	})
	if !errors.Is(err, gocronbaton.ErrNotLeader) || !strings.Contains(err.Error(), "MinRemaining") {
		t.Errorf("IsLeader with a term shorter than MinRemaining: %v", err)
	}
}

// Between the election and the start of Lead, IsLeader says no: a run
// started then would find no term to join (Job refuses it), so gocron must
// skip it instead.
func TestElectorNotLeaderBeforeLead(t *testing.T) {
	b := newBackend(t, memory.NewStore())
	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: "cron", Candidate: baton.Candidate{ID: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	el, err := gocronbaton.NewElector(e, gocronbaton.ElectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	gate := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(ctx context.Context, term baton.Term) error {
			<-gate
			return el.Lead(ctx, term)
		})
	}()
	if _, err := e.Await(ctx); err != nil {
		t.Fatal(err)
	}
	if err := el.IsLeader(ctx); !errors.Is(err, gocronbaton.ErrNotLeader) {
		t.Errorf("IsLeader before Lead started = %v, want ErrNotLeader", err)
	}
	ran := false
	job := el.Job(func(context.Context, baton.Term) error { ran = true; return nil })
	if err := job(ctx); !errors.Is(err, gocronbaton.ErrNotLeader) || ran {
		t.Errorf("a run before Lead started: %v (ran: %v), want ErrNotLeader", err, ran)
	}
	close(gate)
	testkit.EventuallyErr(t, 10*time.Second, "IsLeader once Lead runs", func() error { return el.IsLeader(ctx) })
	if err := job(ctx); err != nil || !ran {
		t.Errorf("a run once Lead runs: %v (ran: %v)", err, ran)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
}
