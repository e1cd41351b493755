package raftagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/raft"
)

// timeFormat is RFC 3339 with milliseconds, in UTC.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// jsonTime is a time that encodes as RFC 3339 with milliseconds, or null
// when zero.
type jsonTime time.Time

// MarshalJSON implements json.Marshaler.
func (t jsonTime) MarshalJSON() ([]byte, error) {
	if time.Time(t).IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + time.Time(t).UTC().Format(timeFormat) + `"`), nil
}

// leaseJSON is a lease as the API shows it.
type leaseJSON struct {
	Name            string   `json:"name"`
	Holder          string   `json:"holder"`       // "" when free
	Token           uint64   `json:"token,string"` // a string: tokens exceed 2^53, past which JSON numbers lose digits in JavaScript and jq 1.6
	Since           jsonTime `json:"since"`
	SafeUntil       jsonTime `json:"safe_until"`
	Member          string   `json:"member"`
	HeldHere        bool     `json:"held_here"` // the holder campaigns through this agent
	Waiters         int      `json:"waiters"`
	ResignRequested bool     `json:"resign_requested"`
}

func (h *Handler) leaseJSON(in raft.LeaseInfo) leaseJSON {
	return leaseJSON{
		Name: in.Name, Holder: in.Holder, Token: in.Token, Since: jsonTime(in.Since), SafeUntil: jsonTime(in.SafeUntil),
		Member: in.Member, HeldHere: in.Holder != "" && in.Member == h.src.ID(), Waiters: in.Waiters,
		ResignRequested: in.ResignRequested,
	}
}

// GET /v1/leases
func (h *Handler) serveLeases(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.readCtx(r)
	defer cancel()
	infos, err := h.src.Leases(ctx)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "reading the lease table: "+err.Error())
		return
	}
	out := struct {
		Leases []leaseJSON `json:"leases"`
	}{Leases: make([]leaseJSON, 0, len(infos))}
	for _, in := range infos {
		out.Leases = append(out.Leases, h.leaseJSON(in))
	}
	writeJSON(w, http.StatusOK, out)
}

// GET /v1/leases/{name}
func (h *Handler) serveLease(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx, cancel := h.readCtx(r)
	defer cancel()
	in, err := h.src.Lease(ctx, name)
	switch {
	case errors.Is(err, baton.ErrNoLeader):
		writeJSON(w, http.StatusNotFound, errorBody{Lease: name,
			Error: fmt.Sprintf("lease %q is unknown to the group: nobody holds it or waits for it", name)})
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Lease: name, Error: fmt.Sprintf("reading lease %q: %v", name, err)})
	default:
		writeJSON(w, http.StatusOK, h.leaseJSON(in))
	}
}

// resignBody answers POST /v1/leases/{name}/resign.
type resignBody struct {
	// Status is "released" (200: the term asked to resign has ended) or
	// "requested" (202: committed, the holder has not released yet).
	Status string `json:"status"`
	// Lease is the lease's state after the call; null when the group has
	// no record of it any more (nobody holds it or waits).
	Lease *leaseJSON `json:"lease"`
	// Ended is the term that ended, with 200.
	Ended *endedJSON `json:"ended,omitempty"`
}

type endedJSON struct {
	Holder string `json:"holder"`
	Token  uint64 `json:"token,string"`
	Kind   string `json:"kind"`   // released or lost
	Reason string `json:"reason"` // resign-requested, resigned, session-expired, session-closed
}

// POST /v1/leases/{name}/resign[?wait=DURATION]
func (h *Handler) serveResign(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	wait := DefaultResignWait
	if s := r.URL.Query().Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			writeJSON(w, http.StatusBadRequest, errorBody{Lease: name, Error: fmt.Sprintf("wait %q: want a duration such as 10s, or 0 not to wait", s)})
			return
		}
		wait = min(d, h.opts.MaxResignWait)
	}
	ctx, cancel := h.readCtx(r)
	in, err := h.src.Lease(ctx, name)
	cancel()
	if err == nil && in.Holder == "" {
		err = baton.ErrNoLeader
	}
	switch {
	case errors.Is(err, baton.ErrNoLeader):
		writeJSON(w, http.StatusNotFound, errorBody{Lease: name, Error: fmt.Sprintf("lease %q has no holder to resign", name)})
		return
	case err != nil:
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Lease: name, Error: fmt.Sprintf("reading lease %q: %v", name, err)})
		return
	}
	// Wait for the end of the term just read (or of a later one: if it
	// ended meanwhile, the request goes to the next holder, and the caller
	// sees both in the answer).
	done, forget := h.hist.awaitEnd(name, in.Token)
	defer forget()
	rctx, cancel := context.WithTimeout(r.Context(), max(h.opts.ReadTimeout, 5*time.Second))
	err = h.src.RequestResign(rctx, name)
	cancel()
	if err != nil {
		select {
		case e := <-done:
			h.resigned(w, r, name, e) // it ended by itself first
			return
		default:
		}
		if errors.Is(err, baton.ErrNoLeader) {
			writeJSON(w, http.StatusNotFound, errorBody{Lease: name, Error: fmt.Sprintf("lease %q has no holder to resign", name)})
			return
		}
		writeJSON(w, http.StatusServiceUnavailable, errorBody{Lease: name, Error: fmt.Sprintf("requesting resign of lease %q: %v", name, err)})
		return
	}
	h.log.Info("resign requested", "lease", name, "holder", in.Holder, "token", in.Token, "remote", r.RemoteAddr)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case e := <-done:
		h.resigned(w, r, name, e)
	case <-t.C:
		h.requested(w, r, name)
	case <-r.Context().Done():
	case <-h.ctx.Done():
		h.requested(w, r, name)
	}
}

// resigned answers 200: the term ended.
func (h *Handler) resigned(w http.ResponseWriter, r *http.Request, name string, e ended) {
	body := resignBody{Status: "released", Ended: &endedJSON{Holder: e.Holder, Token: e.Token, Kind: string(e.Kind), Reason: e.Reason}}
	body.Lease = h.current(r, name)
	writeJSON(w, http.StatusOK, body)
}

// requested answers 202: committed, not yet acted on.
func (h *Handler) requested(w http.ResponseWriter, r *http.Request, name string) {
	writeJSON(w, http.StatusAccepted, resignBody{Status: "requested", Lease: h.current(r, name)})
}

// current reads name for an answer; nil when the group has no record of it
// or the read failed.
func (h *Handler) current(r *http.Request, name string) *leaseJSON {
	ctx, cancel := h.readCtx(r)
	defer cancel()
	in, err := h.src.Lease(ctx, name)
	if err != nil {
		return nil
	}
	j := h.leaseJSON(in)
	return &j
}

// healthBody answers GET /v1/health/leader.
type healthBody struct {
	Status string `json:"status"` // leader, standby or undetermined
	Lease  string `json:"lease,omitempty"`
	Holder string `json:"holder,omitempty"`
	Token  uint64 `json:"token,omitempty,string"`
	Member string `json:"member,omitempty"`
	Reason string `json:"reason"`
	// Leases lists the lease names, when the call must name one.
	Leases []string `json:"leases,omitempty"`
}

// GET|HEAD /v1/health/leader[?lease=NAME]: 200 when a client of this agent
// holds the lease, 429 when another does, 503 when that cannot be told.
func (h *Handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("lease")
	undetermined := func(reason string) {
		writeJSON(w, http.StatusServiceUnavailable, healthBody{Status: "undetermined", Lease: name, Reason: reason})
	}
	if err := h.src.Determined(); err != nil {
		undetermined("this member cannot tell who holds what: " + err.Error())
		return
	}
	ctx, cancel := h.readCtx(r)
	defer cancel()
	if name == "" {
		infos, err := h.src.Leases(ctx)
		if err != nil {
			undetermined("reading the lease table: " + err.Error())
			return
		}
		if len(infos) != 1 {
			names := make([]string, 0, len(infos))
			for _, in := range infos {
				names = append(names, in.Name)
			}
			reason := "the group has no leases: name one with ?lease=NAME"
			if len(names) > 1 {
				reason = fmt.Sprintf("the group has %d leases: name one with ?lease=NAME (%s)", len(names), strings.Join(names, ", "))
			}
			writeJSON(w, http.StatusBadRequest, healthBody{Status: "undetermined", Reason: reason, Leases: names})
			return
		}
		name = infos[0].Name
	}
	in, err := h.src.Lease(ctx, name)
	switch {
	case errors.Is(err, baton.ErrNoLeader) || (err == nil && in.Holder == ""):
		undetermined(fmt.Sprintf("nobody holds lease %q", name))
	case err != nil:
		undetermined(fmt.Sprintf("reading lease %q: %v", name, err))
	case in.Member == h.src.ID():
		writeJSON(w, http.StatusOK, healthBody{Status: "leader", Lease: name, Holder: in.Holder, Token: in.Token, Member: in.Member,
			Reason: fmt.Sprintf("%s, a client of this agent, holds lease %q", in.Holder, name)})
	default:
		writeJSON(w, http.StatusTooManyRequests, healthBody{Status: "standby", Lease: name, Holder: in.Holder, Token: in.Token, Member: in.Member,
			Reason: fmt.Sprintf("%s holds lease %q through member %s, not this agent", in.Holder, name, in.Member)})
	}
}
