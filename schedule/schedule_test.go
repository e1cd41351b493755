package schedule_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/schedule"
	"github.com/robfig/cron/v3"
)

func TestParse(t *testing.T) {
	for _, spec := range []string{"0 3 * * *", "*/10 * * * * *", "@daily", "@every 90s", "CRON_TZ=Europe/Berlin 30 6 * * 1-5", "TZ=UTC 0 0 1 1 *"} {
		if _, err := schedule.Parse(spec); err != nil {
			t.Errorf("Parse(%q): %v", spec, err)
		}
	}
	for spec, want := range map[string]string{
		"":                            "empty cron spec",
		"* * *":                       "want five fields",
		"61 * * * *":                  "want five fields",
		"CRON_TZ=Mars/Base * * * * *": "Mars/Base",
		"0 0 30 2 *":                  "never fires",
		"CRON_TZ=UTC":                 "must be followed by a space",
		"TZ=Europe/Berlin":            "must be followed by a space",
		"@every 0s":                   "at least 1s",
		"@every -5s":                  "at least 1s",
	} {
		_, err := schedule.Parse(spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
	s, _ := schedule.Parse("CRON_TZ=Asia/Tokyo 0 9 * * *")
	next := s.Next(time.Date(2026, 11, 21, 23, 0, 0, 0, time.UTC)) // 08:00 in Tokyo
	if want := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC); !next.Equal(want) {
		t.Errorf("CRON_TZ: next = %s, want %s", next, want)
	}
}

func TestParseCatchUp(t *testing.T) {
	for s, want := range map[string]schedule.CatchUp{"none": schedule.CatchUpNone, "last": schedule.CatchUpLast} {
		got, err := schedule.ParseCatchUp(s)
		if err != nil || got != want || got.String() != s {
			t.Errorf("ParseCatchUp(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := schedule.ParseCatchUp("all"); err == nil || !strings.Contains(err.Error(), "want none") {
		t.Errorf("ParseCatchUp(all) = %v", err)
	}
}

// group is a few processes sharing one in-memory store.
type group struct {
	t     *testing.T
	store *memory.Store
}

func (g *group) backend() *memory.Backend {
	b, err := memory.New(g.store, memory.Options{Config: backend.Config{TTL: time.Second}})
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { _ = b.Close(context.Background()) })
	return b
}

// runs records the slots run, in order.
type runs struct {
	mu    sync.Mutex
	slots []schedule.Slot
	by    []string
}

func (r *runs) add(s schedule.Slot, by string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.slots = append(r.slots, s)
	r.by = append(r.by, by)
}

func (r *runs) snapshot() []schedule.Slot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]schedule.Slot(nil), r.slots...)
}

func everySecond(t *testing.T) *schedule.Job {
	s, err := schedule.Parse("* * * * * *")
	if err != nil {
		t.Fatal(err)
	}
	return &schedule.Job{Name: "tick", Schedule: s, CatchUp: schedule.CatchUpLast}
}

// Three Electors run one job; leaders hand over twice. Every slot from the
// first to the last runs exactly once, in order, with rising tokens.
func TestOncePerSlotAcrossHandOvers(t *testing.T) {
	g := &group{t: t, store: memory.NewStore()}
	var r runs
	type member struct {
		e      *baton.Elector
		cancel context.CancelFunc
		done   chan struct{}
	}
	var members []*member
	for _, id := range []string{"a", "b", "c"} {
		e, err := baton.NewElector(g.backend(), baton.ElectorConfig{Lease: "tick", Candidate: baton.Candidate{ID: id}})
		if err != nil {
			t.Fatal(err)
		}
		job := everySecond(t)
		job.Candidate = id
		job.Run = func(ctx context.Context, s schedule.Slot) error {
			r.add(s, id)
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		m := &member{e: e, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(m.done)
			_ = e.Run(ctx, job.Lead)
		}()
		members = append(members, m)
		t.Cleanup(func() { cancel(); <-m.done })
	}
	leader := func() *member {
		for _, m := range members {
			if m.e.Status().Leader {
				return m
			}
		}
		return nil
	}
	for range 2 {
		n := len(r.snapshot())
		testkit.Eventually(t, 10*time.Second, "two more slots", func() bool { return len(r.snapshot()) >= n+2 })
		m := leader()
		if m == nil {
			t.Fatal("slots ran, but no Elector leads")
		}
		m.cancel() // resigns: a hand-over
		<-m.done
	}
	n := len(r.snapshot())
	testkit.Eventually(t, 10*time.Second, "two slots after the last hand-over", func() bool { return len(r.snapshot()) >= n+2 })

	ss := r.snapshot()
	for i := 1; i < len(ss); i++ {
		if d := ss[i].Time.Sub(ss[i-1].Time); d != time.Second {
			t.Errorf("slot %s follows %s: want one second later (no repeats, no gaps)", ss[i].Time.Format(time.TimeOnly), ss[i-1].Time.Format(time.TimeOnly))
		}
		if ss[i].Token < ss[i-1].Token {
			t.Errorf("token went back from %d to %d", ss[i-1].Token, ss[i].Token)
		}
	}
	r.mu.Lock()
	by := map[string]bool{}
	for _, b := range r.by {
		by[b] = true
	}
	r.mu.Unlock()
	if len(by) != 3 {
		t.Errorf("slots ran on %v; want all three members, one after each hand-over", by)
	}
}

// A leader cut off in the middle of a run loses its term; the successor
// does not run that slot again, and goes on with the next ones.
func TestSlotOfDeadLeaderNotRerun(t *testing.T) {
	g := &group{t: t, store: memory.NewStore()}
	ba, bb := g.backend(), g.backend()
	ta, err := ba.Campaign(context.Background(), "tick", baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan schedule.Slot, 1)
	ja := everySecond(t)
	ja.Run = func(ctx context.Context, s schedule.Slot) error {
		started <- s
		ba.Disconnect() // a dies here, mid-run, as far as the store knows
		<-ctx.Done()
		return ctx.Err()
	}
	leadDone := make(chan error, 1)
	go func() { leadDone <- ja.Lead(context.Background(), ta) }()
	var first schedule.Slot
	select {
	case first = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("a's first slot did not start")
	}
	if err := <-leadDone; err != nil {
		t.Errorf("Lead returned %v after the term ended; want nil", err)
	}

	tb, err := bb.Campaign(context.Background(), "tick", baton.Candidate{ID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	var r runs
	jb := everySecond(t)
	jb.Run = func(ctx context.Context, s schedule.Slot) error { r.add(s, "b"); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	go func() { leadDone <- jb.Lead(ctx, tb) }()
	testkit.Eventually(t, 10*time.Second, "b to run a slot", func() bool { return len(r.snapshot()) >= 1 })
	cancel()
	<-leadDone
	for _, s := range r.snapshot() {
		if !s.Time.After(first.Time) {
			t.Errorf("b ran slot %s, which a had claimed (or an earlier one)", s.Time.Format(time.TimeOnly))
		}
	}
	_ = tb.Resign(context.Background())
}

// storeRecord writes a record as a previous leader would have.
func storeRecord(t *testing.T, b baton.Backend, rec schedule.Record) {
	t.Helper()
	term, err := b.Campaign(context.Background(), "tick", baton.Candidate{ID: "old"})
	if err != nil {
		t.Fatal(err)
	}
	st, ok := term.(baton.StateTerm)
	if !ok {
		t.Fatalf("the memory backend's term %T keeps no state", term)
	}
	v, _ := json.Marshal(rec)
	if err := st.StoreState(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// firstRun leads with job until its first run and returns that slot.
func firstRun(t *testing.T, b baton.Backend, job *schedule.Job) (schedule.Slot, time.Time) {
	t.Helper()
	term, err := b.Campaign(context.Background(), "tick", baton.Candidate{ID: "new"})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())
	got := make(chan schedule.Slot, 1)
	job.Run = func(ctx context.Context, s schedule.Slot) error {
		select {
		case got <- s:
		default:
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- job.Lead(ctx, term) }()
	select {
	case s := <-got:
		cancel()
		<-done
		return s, start
	case err := <-done:
		t.Fatalf("Lead returned %v before running a slot", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no slot ran")
	}
	return schedule.Slot{}, start
}

func TestCatchUp(t *testing.T) {
	old := time.Now().Add(-10 * time.Second).Truncate(time.Second)
	t.Run("last", func(t *testing.T) {
		g := &group{t: t, store: memory.NewStore()}
		b := g.backend()
		storeRecord(t, b, schedule.Record{Job: "tick", Slot: old})
		job := everySecond(t)
		s, start := firstRun(t, b, job)
		// The latest slot before the new leader started, run at once.
		if s.Time.After(start) || start.Sub(s.Time) > time.Second {
			t.Errorf("first run: slot %s, leader started %s; want the latest missed slot", s.Time.Format(time.StampMilli), start.Format(time.StampMilli))
		}
	})
	t.Run("none", func(t *testing.T) {
		g := &group{t: t, store: memory.NewStore()}
		b := g.backend()
		storeRecord(t, b, schedule.Record{Job: "tick", Slot: old})
		job := everySecond(t)
		job.CatchUp = schedule.CatchUpNone
		s, start := firstRun(t, b, job)
		if !s.Time.After(start) {
			t.Errorf("first run: slot %s, leader started %s; want the next slot after the start", s.Time.Format(time.StampMilli), start.Format(time.StampMilli))
		}
	})
}

func TestRecordOfAnotherJobRefused(t *testing.T) {
	g := &group{t: t, store: memory.NewStore()}
	b := g.backend()
	storeRecord(t, b, schedule.Record{Job: "backup", Slot: time.Now()})
	term, err := b.Campaign(context.Background(), "tick", baton.Candidate{ID: "new"})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())
	job := everySecond(t)
	job.Run = func(context.Context, schedule.Slot) error { return nil }
	err = job.Lead(context.Background(), term)
	if err == nil || !strings.Contains(err.Error(), `job "backup", not "tick"`) {
		t.Errorf("Lead on another job's lease: %v", err)
	}
}

// stateless hides a term's state methods, as a third-party backend might.
type stateless struct{ baton.Term }

func TestNoState(t *testing.T) {
	g := &group{t: t, store: memory.NewStore()}
	term, err := g.backend().Campaign(context.Background(), "tick", baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Resign(context.Background())
	job := everySecond(t)
	job.Run = func(context.Context, schedule.Slot) error { return nil }
	if err := job.Lead(context.Background(), stateless{term}); !errors.Is(err, schedule.ErrNoState) {
		t.Errorf("Lead on a stateless term: %v, want ErrNoState", err)
	}
}

func TestLatestBefore(t *testing.T) {
	mustParse := func(spec string) cron.Schedule {
		s, err := schedule.Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		spec, after, now, want string
		n                      int
	}{
		{"CRON_TZ=UTC * * * * * *", "2026-11-22T10:00:00Z", "2026-11-22T10:00:05.5Z", "2026-11-22T10:00:05Z", 5},
		{"CRON_TZ=UTC */4 * * * * *", "2026-11-22T10:00:00Z", "2026-11-22T10:00:04Z", "2026-11-22T10:00:04Z", 1},
		{"CRON_TZ=UTC 0 3 * * *", "2026-11-19T03:00:00Z", "2026-11-22T10:00:00Z", "2026-11-22T03:00:00Z", 3},
		// Too many to walk: the latest is still exact.
		{"CRON_TZ=UTC * * * * * *", "2026-11-20T10:00:00Z", "2026-11-22T10:00:05.5Z", "2026-11-22T10:00:05Z", -1},
	} {
		got, n := schedule.LatestBefore(mustParse(tc.spec), at(tc.after), at(tc.now))
		if !got.Equal(at(tc.want)) || (tc.n >= 0 && n != tc.n) || n < 1 {
			t.Errorf("%s after %s, now %s: got %s (%d slots), want %s (%d)", tc.spec, tc.after, tc.now, got.UTC().Format(time.RFC3339), n, tc.want, tc.n)
		}
	}
}

func TestCheckJitter(t *testing.T) {
	s, _ := schedule.Parse("*/10 * * * * *")
	if err := schedule.CheckJitter(s, 9*time.Second); err != nil {
		t.Errorf("jitter 9s on a 10s schedule: %v", err)
	}
	if err := schedule.CheckJitter(s, 10*time.Second); err == nil || !strings.Contains(err.Error(), "not shorter than the 10s") {
		t.Errorf("jitter 10s on a 10s schedule: %v", err)
	}
}

// cancelOnClaim stops the leader (cancels its context) as its claim of a
// slot is being stored, as a SIGTERM arriving then would.
type cancelOnClaim struct {
	baton.StateTerm
	cancel  context.CancelFunc
	claimed chan time.Time
}

func (c *cancelOnClaim) StoreState(ctx context.Context, v []byte) error {
	err := c.StateTerm.StoreState(ctx, v)
	var rec schedule.Record
	if json.Unmarshal(v, &rec) == nil && !rec.Started.IsZero() && rec.Finished.IsZero() {
		c.cancel()
		select {
		case c.claimed <- rec.Slot:
		default:
		}
	}
	return err
}

// A leader stopped while its claim is stored, with its term still valid,
// gives the slot back: it doesn't run it, and the next leader does.
func TestStoppedRightAfterClaimGivesSlotBack(t *testing.T) {
	g := &group{t: t, store: memory.NewStore()}
	b := g.backend()
	term, err := b.Campaign(context.Background(), "tick", baton.Candidate{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := term.(baton.StateTerm)
	ctx, cancel := context.WithCancel(context.Background())
	w := &cancelOnClaim{StateTerm: st, cancel: cancel, claimed: make(chan time.Time, 1)}
	ja := everySecond(t)
	ja.Run = func(context.Context, schedule.Slot) error {
		t.Error("the stopped leader ran the slot it had just claimed")
		return nil
	}
	if err := ja.Lead(ctx, w); err != nil {
		t.Fatalf("Lead: %v", err)
	}
	var claimed time.Time
	select {
	case claimed = <-w.claimed:
	default:
		t.Fatal("no slot was claimed")
	}
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	jb := everySecond(t)
	s, _ := firstRun(t, b, jb)
	if !s.Time.Equal(claimed) {
		t.Errorf("the next leader ran slot %s first; want the given-back slot %s", s.Time.Format(time.TimeOnly), claimed.Format(time.TimeOnly))
	}
}
