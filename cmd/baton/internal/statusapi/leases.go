package statusapi

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// timeFormat is RFC 3339 with milliseconds, in UTC.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// JSONTime is a time that encodes as RFC 3339 with milliseconds in UTC, or
// null when zero.
type JSONTime time.Time

// MarshalJSON implements json.Marshaler.
func (t JSONTime) MarshalJSON() ([]byte, error) {
	if time.Time(t).IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + time.Time(t).UTC().Format(timeFormat) + `"`), nil
}

// LeaseView is a lease as the API shows it.
type LeaseView struct {
	Name            string   `json:"name"`
	Holder          string   `json:"holder"`       // "" when free
	Token           uint64   `json:"token,string"` // a string: tokens exceed 2^53, past which JSON numbers lose digits in JavaScript and jq 1.6
	Since           JSONTime `json:"since"`
	SafeUntil       JSONTime `json:"safe_until"`
	Member          string   `json:"member"`
	HeldHere        bool     `json:"held_here"` // Member is the source's ID
	Waiters         int      `json:"waiters"`
	ResignRequested bool     `json:"resign_requested"`
}

// View returns in as the API shows it.
func (h *Handler) View(in LeaseInfo) LeaseView {
	return LeaseView{
		Name: in.Name, Holder: in.Holder, Token: in.Token, Since: JSONTime(in.Since), SafeUntil: JSONTime(in.SafeUntil),
		Member: in.Member, HeldHere: heldHere(h.src, in.Holder, in.Member), Waiters: in.Waiters,
		ResignRequested: in.ResignRequested,
	}
}

// GET /v1/leases
func (h *Handler) serveLeases(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ReadContext(r)
	defer cancel()
	infos, err := h.src.Leases(ctx)
	if err != nil {
		WriteError(w, http.StatusServiceUnavailable, "reading the lease table: "+err.Error())
		return
	}
	out := struct {
		Leases []LeaseView `json:"leases"`
	}{Leases: make([]LeaseView, 0, len(infos))}
	for _, in := range infos {
		out.Leases = append(out.Leases, h.View(in))
	}
	WriteJSON(w, http.StatusOK, out)
}

// GET /v1/leases/{name}
func (h *Handler) serveLease(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx, cancel := h.ReadContext(r)
	defer cancel()
	in, err := h.src.Lease(ctx, name)
	switch {
	case isNoLeader(err):
		WriteJSON(w, http.StatusNotFound, ErrorBody{Lease: name,
			Error: fmt.Sprintf("lease %q is unknown here: %v", name, err)})
	case err != nil:
		WriteJSON(w, http.StatusServiceUnavailable, ErrorBody{Lease: name, Error: fmt.Sprintf("reading lease %q: %v", name, err)})
	default:
		WriteJSON(w, http.StatusOK, h.View(in))
	}
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

// GET|HEAD /v1/health/leader[?lease=NAME]: 200 when the lease is held
// here, 429 when another holds it, 503 when that cannot be told.
func (h *Handler) serveHealth(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("lease")
	undetermined := func(reason string) {
		WriteJSON(w, http.StatusServiceUnavailable, healthBody{Status: "undetermined", Lease: name, Reason: reason})
	}
	if lh, ok := h.src.(interface {
		heldNow(name string) (LeaseInfo, bool)
	}); ok {
		// This process's own term answers, without a read that a
		// raft election or a slow backend would hold up.
		if in, ok := lh.heldNow(name); ok {
			WriteJSON(w, http.StatusOK, healthBody{Status: "leader", Lease: in.Name, Holder: in.Holder, Token: in.Token, Member: in.Member,
				Reason: fmt.Sprintf("%s, %s, holds lease %q", in.Holder, h.opts.Here, in.Name)})
			return
		}
	}
	if err := h.src.Determined(); err != nil {
		undetermined("this process cannot tell who holds what: " + err.Error())
		return
	}
	ctx, cancel := h.ReadContext(r)
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
			WriteJSON(w, http.StatusBadRequest, healthBody{Status: "undetermined", Reason: reason, Leases: names})
			return
		}
		name = infos[0].Name
	}
	in, err := h.src.Lease(ctx, name)
	switch {
	case isNoLeader(err) || (err == nil && in.Holder == ""):
		undetermined(fmt.Sprintf("nobody holds lease %q", name))
	case err != nil:
		undetermined(fmt.Sprintf("reading lease %q: %v", name, err))
	case heldHere(h.src, in.Holder, in.Member):
		WriteJSON(w, http.StatusOK, healthBody{Status: "leader", Lease: name, Holder: in.Holder, Token: in.Token, Member: in.Member,
			Reason: fmt.Sprintf("%s, %s, holds lease %q", in.Holder, h.opts.Here, name)})
	default:
		WriteJSON(w, http.StatusTooManyRequests, healthBody{Status: "standby", Lease: name, Holder: in.Holder, Token: in.Token, Member: in.Member,
			Reason: fmt.Sprintf("%s holds lease %q%s, not %s", in.Holder, name, h.via(in), h.opts.Here)})
	}
}

// via names the member a lease is held through, when that is not the
// holder itself.
func (h *Handler) via(in LeaseInfo) string {
	if in.Member == "" || in.Member == in.Holder {
		return ""
	}
	return " through member " + in.Member
}
