// Package health serves a leader health check over HTTP, for load
// balancers, readiness probes and monitors that route to, or watch, the
// instance that leads: GET (or HEAD) /v1/health/leader answers
//
//	200 leader        this process holds the lease
//	429 standby       another candidate holds it
//	503 undetermined  this process cannot tell (the backend cannot be read,
//	                  or nobody holds the lease)
//
// with a JSON body (Answer) that names the holder, its token and why.
// With ?standbyok=true a standby answers 200 instead of 429 (its body still
// says standby), as Vault's /v1/sys/health?standbyok=true does: for
// readiness probes, where a healthy standby is ready too, and a probe
// counts only 2xx and 3xx as success.
// NewLeader makes the handler for any baton.Elector; the same answers, for
// a raft agent's many leases, come from `baton agent`, which mounts
// NewHandler over a Checker of its own.
//
// # What is guaranteed, and what is not
//
//   - A 200 means that, at some instant during the request, this process
//     held the lease: its term had not ended and was before its safe-until
//     (baton.Status.Leader).
//     It does not mean that it still does when the caller acts on the
//     answer: a load balancer routing on it can send a request to a former
//     leader for up to one probe interval. Work that must not run twice is
//     fenced with the term's token (baton.Term.Token), not routed on health
//     checks.
//   - A 429 means the backend named another holder; a 503 means the check
//     could not tell. Neither ever answers for a process that holds the
//     lease, and a 200 never comes from the backend's word alone: a record
//     naming this process while its Elector does not lead (a term that has
//     just ended, or not yet begun) is a 503.
//   - Each answer reads the backend at most once, bounded by
//     Options.ReadTimeout, and only when this process does not lead.
//
// Like client-go's leaderelection.HealthzAdaptor, it is an http.Handler to
// mount on the program's own server:
//
//	h, err := health.NewLeader(e, health.Options{})
//	mux.Handle("GET "+health.Path, h)
//
// The package imports nothing but the standard library and package baton.
package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/httpjson"
)

// Path is where baton's processes serve the leader health check.
const Path = "/v1/health/leader"

// Status is what an Answer says of the lease.
type Status string

// The three answers.
const (
	Leader       Status = "leader"       // this process holds the lease: 200
	Standby      Status = "standby"      // another candidate holds it: 429
	Undetermined Status = "undetermined" // this process cannot tell: 503
)

// Answer is the JSON body of a leader health answer.
type Answer struct {
	// Status is leader, standby or undetermined.
	Status Status `json:"status"`
	// Lease is the lease the answer is about; empty when the request
	// must name one (Leases).
	Lease string `json:"lease,omitempty"`
	// Holder is the holder's candidate ID, when known.
	Holder string `json:"holder,omitempty"`
	// Token is the holder's fencing token, when known; a JSON string,
	// since tokens exceed 2^53, past which JSON numbers lose digits in
	// JavaScript and jq 1.6.
	Token uint64 `json:"token,omitempty,string"`
	// Member is, for a raft group, the member the holder campaigns through.
	Member string `json:"member,omitempty"`
	// Reason says why, in words for an operator.
	Reason string `json:"reason"`
	// Leases lists the lease names a request may choose from with
	// ?lease=NAME, when it must name one.
	Leases []string `json:"leases,omitempty"`
	// NameLease reports that the request must name a lease with
	// ?lease=NAME (a source of several leases, or of none): the answer is
	// then 400 Bad Request, with Status undetermined.
	NameLease bool `json:"-"`
}

// Code returns the HTTP status of a: 200 leader, 429 standby, 503
// undetermined, 400 when the request must name a lease.
func (a Answer) Code() int {
	switch {
	case a.NameLease:
		return http.StatusBadRequest
	case a.Status == Leader:
		return http.StatusOK
	case a.Status == Standby:
		return http.StatusTooManyRequests
	}
	return http.StatusServiceUnavailable
}

// Checker decides the answers of a Handler.
type Checker interface {
	// CheckLeader answers for lease, which is "" when the request names
	// none. ctx bounds any read of the backend.
	CheckLeader(ctx context.Context, lease string) Answer
}

// Options configures a Handler. The zero value means the documented
// defaults.
type Options struct {
	// Here names this process in the answers' reasons ("HOLDER, Here,
	// holds lease NAME"). Default "this process".
	Here string

	// ReadTimeout bounds the read of the backend in each answer. Default
	// 2 s.
	ReadTimeout time.Duration
}

func (o *Options) fill() error {
	if o.Here == "" {
		o.Here = "this process"
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 2 * time.Second
	}
	if o.ReadTimeout < 0 {
		return fmt.Errorf("health: ReadTimeout %s is negative: leave it 0 for the default (2s)", o.ReadTimeout)
	}
	return nil
}

// Handler serves the leader health check: GET and HEAD, with an optional
// ?lease=NAME; other methods get 405. It answers at whatever path it is
// mounted (Path by convention). Safe for concurrent use.
type Handler struct {
	c       Checker
	timeout time.Duration
}

// NewHandler returns a Handler whose answers c decides. opts.Here is not
// used: c words its own reasons.
func NewHandler(c Checker, opts Options) (*Handler, error) {
	if c == nil {
		return nil, errors.New("health: Checker is nil")
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	return &Handler{c: c, timeout: opts.ReadTimeout}, nil
}

// StandbyOK is the query parameter that makes a standby's answer 200
// (GET Path?standbyok=true): "this process is healthy", leader or standby.
const StandbyOK = "standbyok"

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		httpjson.Error(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: the leader health check answers GET and HEAD only", r.Method, r.URL.Path))
		return
	}
	q := r.URL.Query()
	standbyOK := false
	if v := q.Get(StandbyOK); v != "" || q.Has(StandbyOK) {
		ok, err := strconv.ParseBool(v)
		if err != nil {
			httpjson.Error(w, http.StatusBadRequest, fmt.Sprintf("?%s=%q: want true or false (true: a standby answers 200, for readiness probes)", StandbyOK, v))
			return
		}
		standbyOK = ok
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	a := h.c.CheckLeader(ctx, q.Get("lease"))
	code := a.Code()
	if standbyOK && a.Status == Standby && !a.NameLease {
		code = http.StatusOK
	}
	httpjson.Write(w, code, a)
}

// Elector is what NewLeader reads of an Elector: *baton.Elector implements
// it.
type Elector interface {
	// Status returns a snapshot of the Elector's state; its Leader and
	// Term answer without a read of the backend.
	Status() baton.Status
	// Leader asks the backend who holds the Elector's lease.
	Leader(ctx context.Context) (baton.Record, error)
}

var _ Elector = (*baton.Elector)(nil)

// NewLeader returns the leader health check of e's lease. A request may
// name the lease (?lease=NAME); another name than e's is undetermined.
func NewLeader(e Elector, opts Options) (*Handler, error) {
	if e == nil {
		return nil, errors.New("health: Elector is nil")
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	return NewHandler(electorChecker{e: e, here: opts.Here}, opts)
}

// electorChecker answers for one Elector.
type electorChecker struct {
	e    Elector
	here string
}

func (c electorChecker) CheckLeader(ctx context.Context, lease string) Answer {
	st := c.e.Status()
	if lease != "" && lease != st.Lease {
		return Answer{Status: Undetermined, Lease: lease,
			Reason: fmt.Sprintf("this process campaigns for lease %q only", st.Lease), Leases: []string{st.Lease}}
	}
	if st.Leader && st.Term != nil {
		return Answer{Status: Leader, Lease: st.Lease, Holder: st.ID, Token: st.Term.Token(),
			Reason: fmt.Sprintf("%s, %s, holds lease %q", st.ID, c.here, st.Lease)}
	}
	rec, err := c.e.Leader(ctx)
	switch {
	case errors.Is(err, baton.ErrNoLeader):
		return Answer{Status: Undetermined, Lease: st.Lease, Reason: fmt.Sprintf("nobody holds lease %q", st.Lease)}
	case err != nil:
		return Answer{Status: Undetermined, Lease: st.Lease, Reason: fmt.Sprintf("reading lease %q: %v", st.Lease, err)}
	case rec.Holder == st.ID:
		return Answer{Status: Undetermined, Lease: st.Lease,
			Reason: fmt.Sprintf("the backend names %s, %s, as the holder (token %d), but it does not lead here: its term has just ended, or is just beginning", st.ID, c.here, rec.Token)}
	}
	return Answer{Status: Standby, Lease: st.Lease, Holder: rec.Holder, Token: rec.Token,
		Reason: fmt.Sprintf("%s holds lease %q, not %s", rec.Holder, st.Lease, c.here)}
}
