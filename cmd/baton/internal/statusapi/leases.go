package statusapi

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/health"
	"github.com/batonhq/baton/internal/httpjson"
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
func (h *Handler) View(in raft.LeaseInfo) LeaseView {
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
		httpjson.Error(w, http.StatusServiceUnavailable, "reading the lease table: "+err.Error())
		return
	}
	out := struct {
		Leases []LeaseView `json:"leases"`
	}{Leases: make([]LeaseView, 0, len(infos))}
	for _, in := range infos {
		out.Leases = append(out.Leases, h.View(in))
	}
	httpjson.Write(w, http.StatusOK, out)
}

// GET /v1/leases/{name}
func (h *Handler) serveLease(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	ctx, cancel := h.ReadContext(r)
	defer cancel()
	in, err := h.src.Lease(ctx, name)
	switch {
	case isNoLeader(err):
		httpjson.Write(w, http.StatusNotFound, httpjson.ErrorBody{Lease: name,
			Error: fmt.Sprintf("lease %q is unknown here: %v", name, err)})
	case err != nil:
		httpjson.Write(w, http.StatusServiceUnavailable, httpjson.ErrorBody{Lease: name, Error: fmt.Sprintf("reading lease %q: %v", name, err)})
	default:
		httpjson.Write(w, http.StatusOK, h.View(in))
	}
}

// checker decides the answers of GET|HEAD /v1/health/leader[?lease=NAME]
// for the Handler's source: leader when the lease is held here, standby
// when another holds it, undetermined when that cannot be told.
type checker struct{ h *Handler }

// CheckLeader answers for lease name; "" names the source's one lease.
func (c checker) CheckLeader(ctx context.Context, name string) health.Answer {
	h := c.h
	undetermined := func(reason string) health.Answer {
		return health.Answer{Status: health.Undetermined, Lease: name, Reason: reason}
	}
	if lh, ok := h.src.(interface {
		heldNow(name string) (raft.LeaseInfo, bool)
	}); ok {
		// This process's own term answers, without a read that a
		// raft election or a slow backend would hold up.
		if in, ok := lh.heldNow(name); ok {
			return health.Answer{Status: health.Leader, Lease: in.Name, Holder: in.Holder, Token: in.Token, Member: in.Member,
				Reason: fmt.Sprintf("%s, %s, holds lease %q", in.Holder, h.opts.Here, in.Name)}
		}
	}
	if err := h.src.Determined(); err != nil {
		return undetermined("this process cannot tell who holds what: " + err.Error())
	}
	if name == "" {
		infos, err := h.src.Leases(ctx)
		if err != nil {
			return undetermined("reading the lease table: " + err.Error())
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
			return health.Answer{Status: health.Undetermined, Reason: reason, Leases: names, NameLease: true}
		}
		name = infos[0].Name
	}
	in, err := h.src.Lease(ctx, name)
	switch {
	case isNoLeader(err) || (err == nil && in.Holder == ""):
		return undetermined(fmt.Sprintf("nobody holds lease %q", name))
	case err != nil:
		return undetermined(fmt.Sprintf("reading lease %q: %v", name, err))
	case heldHere(h.src, in.Holder, in.Member):
		return health.Answer{Status: health.Leader, Lease: name, Holder: in.Holder, Token: in.Token, Member: in.Member,
			Reason: fmt.Sprintf("%s, %s, holds lease %q", in.Holder, h.opts.Here, name)}
	}
	return health.Answer{Status: health.Standby, Lease: name, Holder: in.Holder, Token: in.Token, Member: in.Member,
		Reason: fmt.Sprintf("%s holds lease %q%s, not %s", in.Holder, name, h.via(in), h.opts.Here)}
}

// via names the member a lease is held through, when that is not the
// holder itself.
func (h *Handler) via(in raft.LeaseInfo) string {
	if in.Member == "" || in.Member == in.Holder {
		return ""
	}
	return " through member " + in.Member
}
