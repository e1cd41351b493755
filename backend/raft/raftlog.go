package raft

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hashicorp/raft and raft-autopilot log through hclog. A member turns their
// records into records of its own slog.Logger (group "raft"), with this
// mapping of levels, which never lowers a warning or an error:
//
//	hclog ERROR -> slog Error    (a failure: an RPC to a peer, a snapshot...)
//	hclog WARN  -> slog Warn     (an election started, a quorum not heard...)
//	hclog INFO  -> slog Debug    (raft's narration of its own steps: entering
//	                              follower state, adding a peer...; the member
//	                              says what matters of it in its own words at
//	                              Info: joined, group configuration, raft leader)
//
// Their key-value pairs become attributes, and "module" names the library
// part ("raft", "raft.autopilot"...).
//
// Repeats are rate-limited: a record with the level, message, peer (the
// attributes that name a peer or server) and error (its text with each run
// of digits taken as one, so that a connection's port or a duration in it
// makes no new error; other attributes, such as a backoff, may differ) of
// one logged less than RaftLogRepeatEvery ago is counted instead of written, and at the end of that interval one summary
// record is written, with the latest record's attributes and "repeated": the
// number of records it stands for. So one dead peer costs a line when it
// fails, then one line per interval while it stays dead, instead of one per
// heartbeat.

// RaftLogRepeatEvery is the interval of the rate limit on repeated raft
// log records.
const RaftLogRepeatEvery = 10 * time.Second

// raftLog is the io.Writer of an hclog JSON logger: it parses each record
// and writes it to log, rate-limited. Safe for concurrent use.
type raftLog struct {
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	seen   map[string]*repeat
	closed bool
}

// repeat is the rate limit's state for one kind of record.
type repeat struct {
	logged     time.Time // when last written
	suppressed int       // records counted since
	level      slog.Level
	msg        string
	attrs      []slog.Attr // the latest counted record's
	timer      *time.Timer // writes the summary; nil when none is due
}

func newRaftLog(log *slog.Logger, every time.Duration) *raftLog {
	return &raftLog{log: log, every: every, seen: map[string]*repeat{}}
}

// hclogger returns an hclog logger that writes to l.
func (l *raftLog) hclogger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "raft", Output: l, Level: hclog.Info, JSONFormat: true})
}

// peerKeys are the attributes that name a peer or server: records that
// differ in them are different failures.
var peerKeys = map[string]bool{"peer": true, "target": true, "server-id": true, "id": true, "address": true, "server": true, "node": true, "to": true, "from": true}

// errorKeys are the attributes that hold an error: records that differ in
// it, beyond its numbers, are different failures.
var errorKeys = map[string]bool{"error": true, "err": true}

// digitRuns matches the numbers in an error's text (ports, addresses,
// durations), which repeats of one failure need not share.
var digitRuns = regexp.MustCompile(`[0-9]+`)

// Write takes hclog JSON records, one a line.
func (l *raftLog) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimSpace(string(p)), "\n") {
		if line != "" {
			l.line(line)
		}
	}
	return len(p), nil
}

// line takes one hclog JSON record; a line that is not one is written as
// it is, at Info.
func (l *raftLog) line(line string) {
	var rec map[string]any
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		l.log.Info(line)
		return
	}
	level := slog.LevelDebug
	switch rec["@level"] {
	case "error":
		level = slog.LevelError
	case "warn":
		level = slog.LevelWarn
	}
	msg, _ := rec["@message"].(string)
	keys := slices.Sorted(maps.Keys(rec))
	var attrs []slog.Attr
	var key strings.Builder
	fmt.Fprintf(&key, "%d\x00%s", level, msg)
	for _, k := range keys {
		switch k {
		case "@level", "@message", "@timestamp", "@caller":
			continue
		case "@module":
			attrs = append(attrs, slog.Any("module", rec[k]))
			fmt.Fprintf(&key, "\x00%v", rec[k])
			continue
		}
		attrs = append(attrs, slog.Any(k, rec[k]))
		switch {
		case peerKeys[k]:
			fmt.Fprintf(&key, "\x00%s=%v", k, rec[k])
		case errorKeys[k]:
			fmt.Fprintf(&key, "\x00%s=%s", k, digitRuns.ReplaceAllString(fmt.Sprint(rec[k]), "#"))
		}
	}
	l.record(key.String(), level, msg, attrs)
}

// record writes a record, or counts it if one of its kind was written
// less than every ago.
func (l *raftLog) record(key string, level slog.Level, msg string, attrs []slog.Attr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	r := l.seen[key]
	if r == nil || (r.suppressed == 0 && now.Sub(r.logged) >= l.every) || l.closed {
		if r == nil {
			l.prune(now)
			r = &repeat{}
			l.seen[key] = r
		}
		r.logged = now
		l.log.LogAttrs(context.Background(), level, msg, attrs...)
		return
	}
	r.suppressed++
	r.level, r.msg, r.attrs = level, msg, attrs
	if r.timer == nil {
		r.timer = time.AfterFunc(r.logged.Add(l.every).Sub(now), func() { l.summarize(r) })
	}
}

// summarize writes r's summary, if records were counted.
func (l *raftLog) summarize(r *repeat) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.summarizeLocked(r)
}

func (l *raftLog) summarizeLocked(r *repeat) {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	if r.suppressed == 0 {
		return
	}
	since := time.Since(r.logged).Round(time.Millisecond)
	attrs := append(slices.Clone(r.attrs), slog.Int("repeated", r.suppressed), slog.Duration("in", since))
	l.log.LogAttrs(context.Background(), r.level, r.msg+" (repeated)", attrs...)
	r.suppressed = 0
	r.logged = time.Now()
}

// prune forgets kinds of records not seen for an interval, so that the
// map stays small.
func (l *raftLog) prune(now time.Time) {
	if len(l.seen) < 256 {
		return
	}
	for k, r := range l.seen {
		if r.timer == nil && now.Sub(r.logged) >= l.every {
			delete(l.seen, k)
		}
	}
}

// close writes the summaries still due and stops the timers; records that
// come later are written as they come.
func (l *raftLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, r := range l.seen {
		l.summarizeLocked(r)
	}
}
