package raft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Group is what a Backend campaigns through: a member of the group (a
// *Node) or a client of a local agent (a *Client, from Dial). Its methods
// are unexported: only this package implements it.
type Group interface {
	// apply commits c through the raft leader, retrying while no leader
	// is available, until ctx ends.
	apply(ctx context.Context, c command) (*result, error)
	// renew renews session through the raft leader and returns its TTL
	// and the leases it must resign; errSessionGone when the group has no
	// such session.
	renew(ctx context.Context, session string) (*renewResponse, error)
	// read returns name's state: through the raft leader (linearizable),
	// or from the nearest copy of the log when stale.
	read(ctx context.Context, name, session string, stale bool) (leaseView, error)
	// readMany is read for many leases (at most maxReadMany), without a
	// session: one request, and on the raft leader one confirmation of
	// leadership, for all of them.
	readMany(ctx context.Context, names []string, stale bool) ([]leaseView, error)
	// wait returns name's state once the copy of the log it reads has
	// applied minIndex and the lease was modified after after (or the
	// session is gone), or when ctx ends (with ctx's error).
	wait(ctx context.Context, name, session string, minIndex, after uint64) (leaseView, error)
	// loadState reads name's state through the raft leader
	// (linearizable).
	loadState(ctx context.Context, name string) (stateView, error)
	// member names the member sessions are created through, for logs.
	member() string
	// witness reports whether the member is a witness, which never
	// campaigns.
	witness() bool
}

var _ Group = (*Node)(nil)

// errSessionGone means the group no longer has a session: it expired (its
// renewals did not reach the raft leader in time) or was destroyed.
var errSessionGone = errors.New("session expired in the group")

// retryNotLeader calls fn until it returns something other than
// ErrNotLeader, or ctx ends.
func retryNotLeader[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	return retryNotLeaderLogged(ctx, nil, "", fn)
}

// retryNotLeaderLogged is retryNotLeader that logs each refusal at debug
// level on log (when not nil), naming what was refused: a renewal
// refused while the group has no raft leader is otherwise silent until
// the session's safe-until passes.
func retryNotLeaderLogged[T any](ctx context.Context, log *slog.Logger, what string, fn func(context.Context) (T, error)) (T, error) {
	backoff := 20 * time.Millisecond
	for attempt := 1; ; attempt++ {
		v, err := fn(ctx)
		if err == nil || !errors.Is(err, ErrNotLeader) {
			return v, err
		}
		if log != nil {
			log.Debug(what+" refused: no raft leader to take it; retrying", "attempt", attempt, "retry_in", backoff, "err", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			var zero T
			return zero, fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-t.C:
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (n *Node) apply(ctx context.Context, c command) (*result, error) {
	return retryNotLeader(ctx, func(ctx context.Context) (*result, error) {
		if n.ctx.Err() != nil {
			return nil, errNodeClosed
		}
		if n.isReady() {
			return n.applyLocal(c)
		}
		var r result
		if err := n.forwardJSON(ctx, "/v1/raft/apply", &c, &r); err != nil {
			return nil, err
		}
		return &r, nil
	})
}

var errNodeClosed = errors.New("raft: member closed")

func (n *Node) renew(ctx context.Context, session string) (*renewResponse, error) {
	start := time.Now()
	r, err := retryNotLeaderLogged(ctx, n.log, "session renewal", func(ctx context.Context) (*renewResponse, error) {
		if n.ctx.Err() != nil {
			return nil, errNodeClosed
		}
		if n.isReady() {
			return n.renewLocal(session)
		}
		var r renewResponse
		if err := n.forwardJSON(ctx, "/v1/raft/renew", &renewRequest{Session: session}, &r); err != nil {
			return nil, err
		}
		return &r, nil
	})
	n.onRenew(time.Since(start), err)
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return nil, errSessionGone
		}
		return nil, err
	}
	return r, nil
}

func (n *Node) read(ctx context.Context, name, session string, stale bool) (leaseView, error) {
	if stale {
		v, _ := n.fsm.lease(name, session)
		return v, nil
	}
	return retryNotLeader(ctx, func(ctx context.Context) (leaseView, error) {
		if n.ctx.Err() != nil {
			return leaseView{}, errNodeClosed
		}
		if n.isReady() {
			return n.readLocal(name, session)
		}
		var v leaseView
		q := url.Values{"name": {name}, "session": {session}}
		err := n.forwardJSON(ctx, "/v1/raft/lease?"+q.Encode(), nil, &v)
		return v, err
	})
}

func (n *Node) readMany(ctx context.Context, names []string, stale bool) ([]leaseView, error) {
	if stale {
		return n.staleMany(names), nil
	}
	vs, err := retryNotLeader(ctx, func(ctx context.Context) ([]leaseView, error) {
		if n.ctx.Err() != nil {
			return nil, errNodeClosed
		}
		if n.isReady() {
			return n.readManyLocal(names)
		}
		var vs []leaseView
		err := n.forwardJSON(ctx, "/v1/raft/read", &readManyRequest{Names: names}, &vs)
		return vs, err
	})
	if notServed(err) {
		// A raft leader of a version without the call: one read each.
		return readEach(ctx, names, func(ctx context.Context, name string) (leaseView, error) { return n.read(ctx, name, "", false) })
	}
	return checkViews(vs, names, err)
}

// notServed reports whether err says that a member or agent of a version
// without POST /v1/raft/read does not serve it: a 404, or the 403 with
// which such an agent's TCP address refuses every POST.
func notServed(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Status == http.StatusForbidden)
}

// readEach is readMany with one read per name.
func readEach(ctx context.Context, names []string, read func(context.Context, string) (leaseView, error)) ([]leaseView, error) {
	vs := make([]leaseView, len(names))
	for i, name := range names {
		v, err := read(ctx, name)
		if err != nil {
			return nil, err
		}
		vs[i] = v
	}
	return vs, nil
}

// checkViews returns vs, or an error when a call's answer does not have
// one view per name asked for.
func checkViews(vs []leaseView, names []string, err error) ([]leaseView, error) {
	if err == nil && len(vs) != len(names) {
		err = fmt.Errorf("raft: a read of %d leases answered %d", len(names), len(vs))
	}
	if err != nil {
		return nil, err
	}
	return vs, nil
}

func (n *Node) wait(ctx context.Context, name, session string, minIndex, after uint64) (leaseView, error) {
	for {
		v, ch := n.fsm.lease(name, session)
		if v.Index >= minIndex && (v.Modified > after || v.SessionGone) {
			return v, nil
		}
		if v.Index < minIndex {
			// This copy of the log lags the write we wait to see.
			_, ch = n.fsm.applied()
			if idx, _ := n.fsm.applied(); idx >= minIndex {
				continue
			}
		}
		select {
		case <-ch:
		case <-n.ctx.Done():
			return leaseView{}, errNodeClosed
		case <-ctx.Done():
			return leaseView{}, ctx.Err()
		}
	}
}

func (n *Node) loadState(ctx context.Context, name string) (stateView, error) {
	return retryNotLeader(ctx, func(ctx context.Context) (stateView, error) {
		if n.ctx.Err() != nil {
			return stateView{}, errNodeClosed
		}
		if n.isReady() {
			return n.stateLocal(name)
		}
		var v stateView
		err := n.forwardJSON(ctx, "/v1/raft/state?"+url.Values{"name": {name}}.Encode(), nil, &v)
		return v, err
	})
}

func (n *Node) member() string { return n.id }

func (n *Node) witness() bool { return n.opts.Witness }

// parseUint is strconv.ParseUint for query values, 0 when absent.
func parseUint(s string) uint64 {
	v, _ := strconv.ParseUint(s, 10, 64)
	return v
}
