// Package schedule runs a cron job on the leader only, at most once per slot
// across the whole group, even across a failover.
//
// A slot is one scheduled time of one job. The job's lease keeps a small
// record (baton.StateTerm): the last slot dealt with, the term that claimed
// it and whether its run finished. The leader claims a slot by storing the
// record before it starts the run, and the store accepts the write only
// while the term still holds the lease: a leader that was replaced, even one
// paused past its safe-until, cannot claim. A new leader reads the record
// and so knows which slots its predecessors ran.
//
// # What is guaranteed
//
//   - At most once: a slot is run only after its claim is stored, and a
//     claim is stored at most once per slot. A leader that dies mid-run
//     leaves its slot claimed but unfinished; the next leader logs it and
//     does not run it again.
//   - Never overlapping within the group, as far as the lease is: runs of
//     one leader are sequential, and a run is stopped (its context
//     cancelled) when the term ends. Across a failover the old run ends by
//     the old term's safe-until, before a new leader can be elected.
//   - Missed slots: slots that came while nobody led, or while the previous
//     run was still going, are either passed over (CatchUpNone) or the
//     latest of them is run at once (CatchUpLast); the others are passed
//     over and logged. "Missed" is judged on the leader's wall clock.
//   - The first leader ever of a job runs nothing from before it was
//     elected: it records the latest slot before its election as passed
//     over, so that a failover before the first run does not lose that run.
//
// Slots are the schedule's times as robfig/cron computes them: in a zone
// with daylight saving time, a daily 01:30 falls twice on the autumn change
// (01:30 before and after it, two distinct slots) and a 02:30 not at all on
// the spring change. Use CRON_TZ=UTC, or a time outside the change, where
// that matters.
//
// This is baton's one cron engine; package gocronbaton only plugs baton's
// leases into gocron's scheduler, for programs that already use gocron.
//
// Not guaranteed: exactly once. A slot whose leader died between the claim
// and the job's work is not run again (use CatchUp and the job's own
// idempotence if that matters). Wall-clock steps move slots like any cron.
package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/robfig/cron/v3"
)

// parser accepts standard five-field specs, an optional leading seconds
// field, descriptors such as @daily and @every 10m, and a CRON_TZ= or TZ=
// prefix naming the time zone.
var parser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse parses a cron spec: five fields (minute hour day-of-month month
// day-of-week), an optional leading seconds field, a descriptor (@yearly,
// @monthly, @weekly, @daily, @hourly, @every DURATION), and an optional
// "CRON_TZ=Zone " prefix (the default zone is the local one). Errors name
// the spec and show an example.
func Parse(spec string) (cron.Schedule, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New(`empty cron spec: want e.g. "0 3 * * *" (03:00 daily) or "*/10 * * * * *" (every 10 seconds)`)
	}
	if (strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=")) && !strings.Contains(spec, " ") {
		return nil, fmt.Errorf("cron spec %q: the time zone must be followed by a space and the fields, e.g. \"CRON_TZ=Europe/Berlin 30 6 * * 1-5\"", spec)
	}
	s, err := parse(spec)
	if err != nil {
		return nil, fmt.Errorf("cron spec %q: %v; want five fields (minute hour day-of-month month day-of-week), optionally a leading seconds field, e.g. \"0 3 * * *\" or \"CRON_TZ=Europe/Berlin 30 6 * * 1-5\"", spec, err)
	}
	// The parser rounds @every durations below 1s up to 1s silently.
	if _, every, ok := strings.Cut(spec, "@every "); ok {
		if d, err := time.ParseDuration(strings.TrimSpace(every)); err == nil && d < time.Second {
			return nil, fmt.Errorf("cron spec %q: @every needs a duration of at least 1s", spec)
		}
	}
	// A spec that never fires (Feb 30) would make the leader idle forever
	// without saying why.
	if s.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("cron spec %q never fires: no date within five years matches it", spec)
	}
	return s, nil
}

// parse calls the cron parser, turning a panic on odd input (robfig/cron
// v3.0.1 has some) into an error.
func parse(spec string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("unparsable (%v)", r)
		}
	}()
	return parser.Parse(spec)
}

// CheckJitter returns an error when jitter is as long as the shortest gap
// between the schedule's next slots: a run delayed that long would find its
// successor already due, and pass it over.
func CheckJitter(s cron.Schedule, jitter time.Duration) error {
	if jitter <= 0 {
		return nil
	}
	prev := s.Next(time.Now())
	for range 20 {
		next := s.Next(prev)
		if next.IsZero() {
			break
		}
		if gap := next.Sub(prev); jitter >= gap {
			return fmt.Errorf("jitter %s is not shorter than the %s between two slots of the schedule: lower it", jitter, gap)
		}
		prev = next
	}
	return nil
}

// CatchUp says what a leader does about slots it finds missed: slots after
// the last one recorded that are already past when it looks.
type CatchUp int

const (
	// CatchUpNone passes over missed slots and waits for the next one.
	CatchUpNone CatchUp = iota
	// CatchUpLast runs the latest missed slot at once, and passes over the
	// earlier ones.
	CatchUpLast
)

// String returns "none" or "last".
func (c CatchUp) String() string {
	switch c {
	case CatchUpNone:
		return "none"
	case CatchUpLast:
		return "last"
	}
	return fmt.Sprintf("CatchUp(%d)", int(c))
}

// ParseCatchUp parses "none" or "last".
func ParseCatchUp(s string) (CatchUp, error) {
	switch s {
	case "none":
		return CatchUpNone, nil
	case "last":
		return CatchUpLast, nil
	}
	return 0, fmt.Errorf("catch-up %q: want none (pass over missed slots) or last (run the latest missed slot at once)", s)
}

// Slot is one scheduled run of a job.
type Slot struct {
	// Job is the job's name.
	Job string
	// Time is the scheduled time, in the schedule's time zone.
	Time time.Time
	// Token is the fencing token of the term that claimed the slot; pass it
	// with the job's writes downstream.
	Token uint64
}

// String returns the slot's time in RFC 3339, as BATON_SLOT carries it.
func (s Slot) String() string { return s.Time.Format(time.RFC3339) }

// Record is what the lease's state holds: the last slot dealt with.
type Record struct {
	// Job is the job's name; a lease's record belongs to one job.
	Job string `json:"job"`
	// Slot is the last slot dealt with: every slot up to it was run or
	// passed over.
	Slot time.Time `json:"slot"`
	// Token is the fencing token of the term that wrote the record.
	Token uint64 `json:"token"`
	// Holder is that term's candidate ID.
	Holder string `json:"holder,omitempty"`
	// Skipped says the slot was passed over, not run.
	Skipped bool `json:"skipped,omitempty"`
	// Started is when the run began (the zero Time when skipped).
	Started time.Time `json:"started,omitzero"`
	// Finished is when the run ended; the zero Time while it runs, or when
	// its leader died before recording the end.
	Finished time.Time `json:"finished,omitzero"`
	// Error is the run's error, if it failed.
	Error string `json:"error,omitempty"`
}

// Job is a cron job that runs on the leader only.
type Job struct {
	// Name identifies the job in its lease's record. Required. One lease
	// carries one job: a lease whose record names another job is refused.
	Name string
	// Schedule is when slots fall, usually from Parse.
	Schedule cron.Schedule
	// CatchUp says what to do about missed slots (default CatchUpNone).
	CatchUp CatchUp
	// Jitter, when positive, delays each run by a random duration in
	// [0, Jitter), so that many jobs on one schedule do not all start in
	// the same second. The slot keeps its scheduled time.
	Jitter time.Duration
	// Run runs one slot. Its context ends when the term ends; Run must then
	// stop promptly. Its error is recorded and logged; the slot is not run
	// again either way.
	Run func(ctx context.Context, s Slot) error
	// Candidate is the holder's candidate ID, recorded with each slot.
	Candidate string
	// Logger receives the job's events; nil discards them.
	Logger *slog.Logger
}

// ErrNoState is returned by Lead for a term whose backend keeps no lease
// state (see baton.StateTerm).
var ErrNoState = errors.New("schedule: the backend keeps no lease state (baton.StateTerm), which once-per-slot needs")

// retry bounds how often a failed state read or write is retried.
const (
	retryMin = 100 * time.Millisecond
	retryMax = 2 * time.Second
)

// Lead runs the job's slots for as long as t lasts and ctx is not done; use
// it as (or inside) the callback of baton.Elector.Run. It returns nil when
// ctx ends or the term ends, and an error when the job cannot run at all
// (no lease state, or a record of another job).
func (j *Job) Lead(ctx context.Context, t baton.Term) error {
	if j.Name == "" || j.Schedule == nil || j.Run == nil {
		return errors.New("schedule: Job needs Name, Schedule and Run")
	}
	st, ok := t.(baton.StateTerm)
	if !ok {
		return ErrNoState
	}
	log := j.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("job", j.Name, "token", t.Token())
	// Runs stop when the term ends even if the caller's ctx does not (an
	// Elector cancels it too, and earlier, by its StopEarly).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-t.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	l := &leader{j: j, st: st, log: log, t: t}

	rec, err := l.load(ctx)
	if err != nil {
		return nilIfEnded(ctx, err)
	}
	var last time.Time
	switch {
	case rec == nil:
		// The first leader ever: slots before its election are not its to
		// run; record that, so that a failover before its first slot does
		// not make the next leader skip that slot as "before it".
		last = time.Now()
		if err := l.store(ctx, Record{Job: j.Name, Slot: last, Skipped: true}); err != nil {
			return nilIfEnded(ctx, err)
		}
		log.Info("first leader of this job: slots from now on will run", "from", last.Format(time.RFC3339))
	case rec.Job != j.Name:
		return fmt.Errorf("schedule: lease %q keeps the record of job %q, not %q: give each job a lease of its own", t.Lease(), rec.Job, j.Name)
	default:
		l.last = *rec
		// In this process's zone, not the writer's offset: a schedule
		// without CRON_TZ runs in the local zone (with its DST).
		last = rec.Slot.Local()
		if !rec.Skipped && rec.Finished.IsZero() && rec.Token != t.Token() {
			log.Warn("the previous leader claimed a slot but did not record its end (it died or lost the lease mid-run); not running it again",
				"slot", rec.Slot.Format(time.RFC3339), "claimed_by", rec.Holder, "claim_token", rec.Token)
		}
	}

	for {
		now := time.Now()
		next := j.Schedule.Next(last)
		if next.IsZero() {
			log.Warn("the schedule has no more slots")
			<-ctx.Done()
			return nil
		}
		var slot time.Time
		if !next.After(now) {
			latest, missed := latestBefore(j.Schedule, last, now)
			if j.CatchUp == CatchUpLast {
				if missed > 1 {
					log.Warn("slots missed; running only the latest (--catch-up=last)", "missed", missed, "passed_over", missed-1, "first", next.Format(time.RFC3339), "latest", latest.Format(time.RFC3339))
				} else {
					log.Info("slot missed; running it now (--catch-up=last)", "slot", latest.Format(time.RFC3339))
				}
				slot = latest
			} else {
				log.Warn("slots missed; passing over them (--catch-up=none)", "missed", missed, "first", next.Format(time.RFC3339), "latest", latest.Format(time.RFC3339))
				if err := l.store(ctx, Record{Job: j.Name, Slot: latest, Skipped: true}); err != nil {
					return nilIfEnded(ctx, err)
				}
				last = latest
				continue
			}
		} else {
			slot = next
			if !sleepUntil(ctx, slot) {
				return nil
			}
		}
		if j.Jitter > 0 {
			if !sleepUntil(ctx, time.Now().Add(rand.N(j.Jitter))) {
				return nil
			}
		}
		if err := l.runSlot(ctx, t, slot); err != nil {
			return nilIfEnded(ctx, err)
		}
		last = slot
	}
}

// leader is one term's bookkeeping.
type leader struct {
	j   *Job
	st  baton.StateTerm
	t   baton.Term
	log *slog.Logger
	// last is the record as this term last stored or read it.
	last Record
}

// runSlot claims slot, runs it and records the end.
func (l *leader) runSlot(ctx context.Context, t baton.Term, slot time.Time) error {
	started := time.Now()
	prev := l.last
	claim := Record{Job: l.j.Name, Slot: slot, Started: started}
	if err := l.store(ctx, claim); err != nil {
		return err
	}
	// The claim is stored: from here the slot counts as run. Don't start
	// what the term can no longer cover.
	if err := t.Err(); err != nil {
		l.log.Warn("the term ended right after claiming the slot; it will not run", "slot", slot.Format(time.RFC3339), "err", err)
		return err
	}
	if ctx.Err() != nil {
		// Stopping (a signal, or renewals lagging) while the term lasts:
		// nothing ran, so give the slot back for the successor to run.
		uctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), t.SafeUntil())
		defer cancel()
		if err := l.store(uctx, prev); err != nil {
			l.log.Warn("stopping right after claiming the slot, and could not give it back; it will not run", "slot", slot.Format(time.RFC3339), "err", err)
		} else {
			l.log.Info("stopping right after claiming the slot; gave it back to the next leader", "slot", slot.Format(time.RFC3339))
		}
		return ctx.Err()
	}
	s := Slot{Job: l.j.Name, Time: slot, Token: t.Token()}
	l.log.Info("running slot", "slot", s.String(), "late", started.Sub(slot).Round(time.Millisecond))
	runErr := l.j.Run(ctx, s)
	done := claim
	done.Finished = time.Now()
	if runErr != nil {
		done.Error = runErr.Error()
		l.log.Warn("slot failed; it is not run again", "slot", s.String(), "err", runErr, "took", done.Finished.Sub(started).Round(time.Millisecond))
	} else {
		l.log.Info("slot done", "slot", s.String(), "took", done.Finished.Sub(started).Round(time.Millisecond))
	}
	sctx := ctx
	if ctx.Err() != nil {
		if t.Err() != nil {
			// The term is over: the record keeps the bare claim, and the
			// successor logs the slot as unfinished.
			return ctx.Err()
		}
		// Stopping (a signal, or StopEarly) while the term still lasts:
		// record how the run ended, within what is left of the term.
		var cancel context.CancelFunc
		sctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), t.SafeUntil())
		defer cancel()
	}
	if err := l.store(sctx, done); err != nil {
		return err
	}
	return ctx.Err()
}

// load reads the record, retrying while the store is unreachable.
func (l *leader) load(ctx context.Context) (*Record, error) {
	wait := retryMin
	for {
		v, err := l.st.LoadState(ctx)
		if err == nil {
			if v == nil {
				return nil, nil
			}
			var rec Record
			if err := json.Unmarshal(v, &rec); err != nil {
				return nil, fmt.Errorf("schedule: lease %q holds state that is not a schedule record (%v): is another program using this lease?", l.st.Lease(), err)
			}
			return &rec, nil
		}
		if !retryable(err) {
			return nil, err
		}
		l.log.Warn("reading the job's record failed; retrying", "err", err, "retry_in", wait)
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			return nil, ctx.Err()
		}
		wait = min(2*wait, retryMax)
	}
}

// store writes rec under the term's fence. An unknown outcome (the store
// unreachable) is settled by reading the record back: a write that landed
// is not repeated, one that did not is retried.
func (l *leader) store(ctx context.Context, rec Record) error {
	rec.Token = l.st.Token()
	rec.Holder = l.j.Candidate
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	wait := retryMin
	for {
		err := l.st.StoreState(ctx, v)
		if err == nil {
			l.last = rec
			return nil
		}
		if !retryable(err) {
			return err
		}
		l.log.Warn("recording the slot failed; checking and retrying", "err", err, "retry_in", wait)
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			return ctx.Err()
		}
		wait = min(2*wait, retryMax)
		got, lerr := l.load(ctx)
		if lerr != nil {
			return lerr
		}
		if got != nil && got.Token == rec.Token && got.Slot.Equal(rec.Slot) && got.Finished.Equal(rec.Finished) && got.Skipped == rec.Skipped {
			l.last = rec
			return nil // the write had landed
		}
	}
}

// retryable reports whether a state call may succeed if tried again within
// the same term.
func retryable(err error) bool {
	return errors.Is(err, baton.ErrBackendUnavailable) && !errors.Is(err, baton.ErrLeaseLost)
}

// nilIfEnded turns the end of the term or of ctx into a clean return.
func nilIfEnded(ctx context.Context, err error) error {
	if ctx.Err() != nil || errors.Is(err, baton.ErrLeaseLost) || errors.Is(err, baton.ErrExpired) ||
		errors.Is(err, baton.ErrResigned) || errors.Is(err, baton.ErrClosed) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// sleepUntil waits until at, and reports false when ctx ended first.
func sleepUntil(ctx context.Context, at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// latestBefore returns the latest slot s with after < s <= now, and how
// many slots fall in that span (capped by the search; at least one). It is
// called only when the first slot after after is not later than now.
func latestBefore(s cron.Schedule, after, now time.Time) (time.Time, int) {
	// Walk forward from after, as far as a bounded number of steps.
	const maxSteps = 10000
	cur, n := after, 0
	for n < maxSteps {
		next := s.Next(cur)
		if next.IsZero() || next.After(now) {
			return cur, n
		}
		cur, n = next, n+1
	}
	// Too many to walk (a seconds schedule after a long outage): find a
	// window just before now that holds a slot, and walk that instead. The
	// count is then a lower bound.
	for _, back := range []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 31 * 24 * time.Hour, 366 * 24 * time.Hour} {
		from := now.Add(-back)
		if from.Before(cur) {
			break
		}
		if next := s.Next(from); !next.IsZero() && !next.After(now) {
			latest := next
			for {
				nn := s.Next(latest)
				if nn.IsZero() || nn.After(now) {
					return latest, n + 1
				}
				latest = nn
			}
		}
	}
	return cur, n
}
