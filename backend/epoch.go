package backend

import (
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"
)

// epochBase is the start of epoch 0, EpochTime(0): 2025-01-01T00:00:00Z.
// Unexported and never written: every process that shares a store must
// compute the same epochs.
var epochBase = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// EpochOf returns the epoch of wall-clock time t: whole seconds since
// 2025-01-01T00:00:00Z (EpochTime(0)), at least 1, so that a clock set
// before then still gives an epoch that beats a store without one, and
// below 2^32, so that epoch<<32 cannot overflow (a clock past the year 2161
// gets the last epoch).
func EpochOf(t time.Time) uint64 {
	s := t.Sub(epochBase) / time.Second
	if s < 1 {
		return 1
	}
	return min(uint64(s), 1<<32-1)
}

// EpochTime returns the start of epoch e.
func EpochTime(e uint64) time.Time { return epochBase.Add(time.Duration(e) * time.Second) }

// EpochToken returns the fencing token of counter in epoch e: e<<32 + counter.
func EpochToken(e, counter uint64) uint64 { return e<<32 + counter }

// FormatEpoch is how stores keep an epoch: its decimal number, then a space and
// its start in RFC 3339 for the humans who read the store.
func FormatEpoch(e uint64) string {
	return strconv.FormatUint(e, 10) + " " + EpochTime(e).UTC().Format(time.RFC3339)
}

// ParseEpoch reads an epoch kept by FormatEpoch (the number alone will do).
func ParseEpoch(s string) (uint64, error) {
	num := s
	for i := range len(s) {
		if s[i] == ' ' {
			num = s[:i]
			break
		}
	}
	e, err := strconv.ParseUint(num, 10, 32)
	if err != nil || e == 0 {
		return 0, fmt.Errorf("epoch %q is not a positive whole number of seconds since %s below 2^32", s, epochBase.Format(time.RFC3339))
	}
	return e, nil
}

// EpochTracker remembers, per key (a lease name, or "" for a store-wide epoch),
// the highest epoch a process has seen in one store, so that an epoch it
// creates after the store lost its data is higher than the old one even
// when its clock is behind. The zero value is ready; it is safe for
// concurrent use.
type EpochTracker struct {
	mu   sync.Mutex
	seen map[string]epochSeen
}

type epochSeen struct{ high, last uint64 }

// Next returns the epoch to create for key at wall-clock time now: EpochOf(now),
// or one above the highest seen if that is higher.
func (t *EpochTracker) Next(key string, now time.Time) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(EpochOf(now), t.seen[key].high+1)
}

// Saw records epoch e as read from the store for key and returns the epoch
// read before it (0 at first), so that the caller can report a change: the
// store lost its data, or was replaced.
func (t *EpochTracker) Saw(key string, e uint64) (prev uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil {
		t.seen = map[string]epochSeen{}
	}
	s := t.seen[key]
	prev = s.last
	t.seen[key] = epochSeen{high: max(s.high, e), last: e}
	return prev
}

// EpochLocation says where an epoch was read, for the messages of EpochTracker.Check.
type EpochLocation struct {
	// Store is the store's name as its users write it: "etcd", "Consul".
	Store string
	// Counter names the store's counter that starts again when the store
	// loses its data: "revisions", "indexes", "zxids".
	Counter string
	// Lease is the lease whose epoch it is, "" for a store-wide epoch.
	Lease string
	// Kind is what holds the epoch in the store ("key", "node"), and Key
	// its name.
	Kind, Key string
	// Delete is a command that deletes Key ("etcdctl del KEY"), named in the
	// error on a value that does not parse; "" names none.
	Delete string
}

// Check parses value, the epoch read at w, records it for w.Lease (as Saw
// does) and logs on log a change from the epoch read there before: the
// store lost its data. It logs at Error if the epoch went backwards (the
// new one was written by a process whose clock is behind, and tokens may
// be lower than before), at Warn if it went up. A value that does not parse
// gives an error that names w.Key and how to delete it, after which the
// next campaign writes a new epoch; the caller wraps it as its backend's
// unavailability.
func (t *EpochTracker) Check(log *slog.Logger, w EpochLocation, value string) (uint64, error) {
	e, err := ParseEpoch(value)
	if err != nil {
		what := "epoch " + w.Kind + " " + w.Key
		if w.Lease != "" {
			what += fmt.Sprintf(" of lease %q", w.Lease)
		}
		del := "delete it"
		if w.Delete != "" {
			del += " (" + w.Delete + ")"
		}
		return 0, fmt.Errorf("%s: %w; %s and baton writes a new one", what, err, del)
	}
	t.Report(log, w, e)
	return e, nil
}

// Report records epoch e, read at w, for w.Lease (as Saw does) and logs on
// log a change from the epoch read there before, as Check does.
func (t *EpochTracker) Report(log *slog.Logger, w EpochLocation, e uint64) {
	prev := t.Saw(w.Lease, e)
	if prev == 0 || prev == e {
		return
	}
	subject, attrs := "the epoch", []any{w.Kind, w.Key, "old_epoch", FormatEpoch(prev), "new_epoch", FormatEpoch(e)}
	if w.Lease != "" {
		subject, attrs = "the lease's epoch", append([]any{"lease", w.Lease}, attrs...)
	}
	if e < prev {
		log.Error(subject+" went backwards: "+w.Store+" lost its data and the new epoch was written by a process whose clock is behind; tokens may be lower than before", attrs...)
	} else {
		log.Warn(subject+" changed: "+w.Store+" lost its data (its "+w.Counter+" started again); tokens carry the new epoch", attrs...)
	}
}
