// Package store is the fenced store of a chaos run: the downstream system
// that the children of `baton run` candidates write to, with their term's
// fencing token.
//
// What it guarantees: a write whose token is lower than the highest token
// the store has accepted is refused (HTTP 409); any other write is accepted
// (HTTP 200), equal tokens included, because one term writes many times.
// This is the fencing rule baton's docs ask every downstream store to apply;
// it is what stops a paused holder that resumes late. The store records
// every write, accepted or refused, with the time it received it, so that
// the checker can count violations and measure leadership afterwards.
// Receive times are taken under the store's lock: the order of Writes is the
// order of their times.
//
// The store serves HTTP on any listener; the harness uses a Unix socket, so
// that children in other network namespaces reach it too. Child is the
// writer the children run.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/batonhq/baton/chaos/internal/record"
)

// maxCandidates bounds the distinct candidate ids the store keeps; a run has
// a handful, so more means a broken writer.
const maxCandidates = 1 << 16

// entry is one recorded write, packed: a long run records millions of them.
// cand indexes Store.names.
type entry struct {
	at       time.Duration
	token    uint64
	seq      int64
	pid      int32
	cand     uint16
	accepted bool
}

// Store is the fenced store. Its methods are safe for concurrent use.
type Store struct {
	clock func() time.Duration
	srv   *http.Server
	log   io.Writer

	mu       sync.Mutex
	entries  []entry
	names    []string
	ids      map[string]uint16
	highest  uint64
	any      bool // a write has been accepted
	last     int  // index in entries of the last accepted write
	logErr   error
	lineBuf  []byte
	refused  int
	accepted int
}

// Option configures a Store.
type Option func(*Store)

// WithLog streams every write to w as it is recorded, one JSON object (a
// record.Write) per line, in receive order, so that a run stopped without
// warning still leaves its history. Lines are written under the store's
// lock, one Write call each; give a buffered w only if you flush it after
// Close. The first error writing to w stops the log and is returned by
// Close and LogErr.
func WithLog(w io.Writer) Option {
	return func(s *Store) { s.log = w }
}

// New returns a store that stamps writes with clock, the run's monotonic
// clock since its start. It serves nothing until Serve.
func New(clock func() time.Duration, opts ...Option) *Store {
	s := &Store{clock: clock, ids: make(map[string]uint16), last: -1}
	for _, o := range opts {
		o(s)
	}
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       time.Minute,
	}
	return s
}

// Serve serves the store's HTTP API on ln until Close. It returns nil after
// Close, and any other error from accepting connections.
func (s *Store) Serve(ln net.Listener) error {
	err := s.srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving, closing open connections; the recorded writes stay
// readable. It returns the first error writing the log, if any.
func (s *Store) Close() error {
	err := s.srv.Close()
	s.mu.Lock()
	logErr := s.logErr
	s.mu.Unlock()
	if logErr != nil {
		return fmt.Errorf("store: writing the log: %w", logErr)
	}
	return err
}

// LogErr returns the first error writing the log (see WithLog), or nil.
func (s *Store) LogErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logErr
}

// Handler returns the store's HTTP API: POST WritePath with a Request
// answers 200 (accepted) or 409 (refused, token too low) with a Response,
// 400 with a message naming what is wrong for a body that is not a valid
// write, and 405 for another method.
func (s *Store) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(WritePath, s.serveWrite)
	return mux
}

func (s *Store) serveWrite(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "store: POST a write to "+WritePath, http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequest))
	if err != nil {
		http.Error(w, "store: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	wr, err := parseRequest(body)
	if err != nil {
		http.Error(w, "store: "+err.Error(), http.StatusBadRequest)
		return
	}
	accepted, highest, err := s.record(wr)
	if err != nil {
		http.Error(w, "store: "+err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if !accepted {
		w.WriteHeader(http.StatusConflict)
	}
	// The status line already carries the outcome; an error writing the
	// body is the client's problem.
	_ = json.NewEncoder(w).Encode(Response{Accepted: accepted, Highest: strconv.FormatUint(highest, 10)})
}

// Write applies the fencing rule to one write made in-process, as a POST to
// WritePath would: a writer in the harness's own process (many leases'
// work in one program, package fenced) needs no HTTP round trip. It
// returns whether the store accepted the write, and an error naming what
// is wrong with a write the HTTP API would answer 400.
func (s *Store) Write(candidate string, token uint64, pid int, seq int64) (bool, error) {
	switch {
	case candidate == "" || len(candidate) > maxCandidate:
		return false, fmt.Errorf("store: candidate %q must be 1 to %d bytes", candidate, maxCandidate)
	case pid <= 0 || pid > math.MaxInt32:
		return false, fmt.Errorf("store: pid %d must be 1 to 2^31-1", pid)
	case seq <= 0:
		return false, fmt.Errorf("store: seq %d must be positive: number a child's writes from 1", seq)
	}
	accepted, _, err := s.record(write{candidate: candidate, token: token, pid: pid, seq: seq})
	return accepted, err
}

// record applies the fencing rule to wr and records it, returning whether it
// was accepted and the highest accepted token after it.
func (s *Store) record(wr write) (bool, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.ids[wr.candidate]
	if !ok {
		if len(s.names) >= maxCandidates {
			return false, 0, fmt.Errorf("more than %d distinct candidate ids; a run has a handful", maxCandidates)
		}
		id = uint16(len(s.names))
		s.names = append(s.names, wr.candidate)
		s.ids[wr.candidate] = id
	}
	e := entry{
		at:    s.clock(),
		token: wr.token,
		seq:   wr.seq,
		pid:   int32(wr.pid),
		cand:  id,
	}
	if !s.any || wr.token >= s.highest {
		e.accepted = true
		s.any = true
		s.highest = wr.token
		s.last = len(s.entries)
		s.accepted++
	} else {
		s.refused++
	}
	s.entries = append(s.entries, e)
	if s.log != nil && s.logErr == nil {
		b, err := json.Marshal(s.toWrite(e))
		if err == nil {
			s.lineBuf = append(append(s.lineBuf[:0], b...), '\n')
			_, err = s.log.Write(s.lineBuf)
		}
		s.logErr = err
	}
	return e.accepted, s.highest, nil
}

// toWrite expands e; s.mu must be held.
func (s *Store) toWrite(e entry) record.Write {
	return record.Write{
		At:        e.at,
		Candidate: s.names[e.cand],
		Token:     e.token,
		PID:       int(e.pid),
		Seq:       e.seq,
		Accepted:  e.accepted,
	}
}

// Writes returns a copy of every write recorded, accepted or refused, in
// receive order (which is also the order of their At).
func (s *Store) Writes() []record.Write {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]record.Write, len(s.entries))
	for i, e := range s.entries {
		out[i] = s.toWrite(e)
	}
	return out
}

// Highest returns the highest token the store has accepted, 0 before the
// first accepted write.
func (s *Store) Highest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.highest
}

// Last returns the last accepted write, whose Candidate is the holder as the
// store sees it now; false before the first accepted write.
func (s *Store) Last() (record.Write, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last < 0 {
		return record.Write{}, false
	}
	return s.toWrite(s.entries[s.last]), true
}

// Counts returns how many writes the store accepted and refused so far,
// without copying them.
func (s *Store) Counts() (accepted, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted, s.refused
}
