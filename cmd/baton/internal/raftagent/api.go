package raftagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/cmd/baton/internal/statusapi"
	"github.com/batonhq/baton/internal/httpjson"
)

// resignBody answers POST /v1/leases/{name}/resign.
type resignBody struct {
	// Status is "released" (200: the term asked to resign has ended) or
	// "requested" (202: committed, the holder has not released yet).
	Status string `json:"status"`
	// Lease is the lease's state after the call; null when the group has
	// no record of it any more (nobody holds it or waits).
	Lease *statusapi.LeaseView `json:"lease"`
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
			httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Lease: name, Error: fmt.Sprintf("wait %q: want a duration such as 10s, or 0 not to wait", s)})
			return
		}
		wait = min(d, h.opts.MaxResignWait)
	}
	ctx, cancel := h.st.ReadContext(r)
	in, err := h.src.Lease(ctx, name)
	cancel()
	if err == nil && in.Holder == "" {
		err = baton.ErrNoLeader
	}
	switch {
	case errors.Is(err, baton.ErrNoLeader):
		httpjson.Write(w, http.StatusNotFound, httpjson.ErrorBody{Lease: name, Error: fmt.Sprintf("lease %q has no holder to resign", name)})
		return
	case err != nil:
		httpjson.Write(w, http.StatusServiceUnavailable, httpjson.ErrorBody{Lease: name, Error: fmt.Sprintf("reading lease %q: %v", name, err)})
		return
	}
	// Wait for the end of the term just read (or of a later one: if it
	// ended meanwhile, the request goes to the next holder, and the caller
	// sees both in the answer).
	done, forget := h.st.AwaitEnd(name, in.Token)
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
			httpjson.Write(w, http.StatusNotFound, httpjson.ErrorBody{Lease: name, Error: fmt.Sprintf("lease %q has no holder to resign", name)})
			return
		}
		httpjson.Write(w, http.StatusServiceUnavailable, httpjson.ErrorBody{Lease: name, Error: fmt.Sprintf("requesting resign of lease %q: %v", name, err)})
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
func (h *Handler) resigned(w http.ResponseWriter, r *http.Request, name string, e statusapi.Ended) {
	body := resignBody{Status: "released", Ended: &endedJSON{Holder: e.Holder, Token: e.Token, Kind: string(e.Kind), Reason: e.Reason}}
	body.Lease = h.current(r, name)
	httpjson.Write(w, http.StatusOK, body)
}

// requested answers 202: committed, not yet acted on.
func (h *Handler) requested(w http.ResponseWriter, r *http.Request, name string) {
	httpjson.Write(w, http.StatusAccepted, resignBody{Status: "requested", Lease: h.current(r, name)})
}

// current reads name for an answer; nil when the group has no record of it
// or the read failed.
func (h *Handler) current(r *http.Request, name string) *statusapi.LeaseView {
	ctx, cancel := h.st.ReadContext(r)
	defer cancel()
	in, err := h.src.Lease(ctx, name)
	if err != nil {
		return nil
	}
	j := h.st.View(in)
	return &j
}
