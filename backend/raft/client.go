package raft

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// ClientOptions configures a Client. The zero value means the defaults.
type ClientOptions struct {
	// Token is the agent's bearer token, when it requires one.
	Token string
	// HTTPClient makes the calls. Nil (the default) means a client of its
	// own.
	HTTPClient *http.Client
}

// Client is a Group that campaigns through a local agent (`baton agent`)
// instead of being a member itself: the agent's member forwards its calls
// to the raft leader. Safe for concurrent use.
type Client struct {
	addr string
	api  *apiClient
}

var _ Group = (*Client)(nil)

// Dial returns a Client of the agent at addr (host:port of its HTTP
// address, usually on loopback). It does not connect yet.
func Dial(addr string, opts ClientOptions) (*Client, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("raft: agent address %q: want host:port, as in agent://127.0.0.1:8787", addr)
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}}
	}
	return &Client{addr: addr, api: &apiClient{secret: opts.Token, hc: hc, scheme: "http"}}, nil
}

func (c *Client) apply(ctx context.Context, cmd command) (*result, error) {
	return retryNotLeader(ctx, func(ctx context.Context) (*result, error) {
		var r result
		err := c.api.call(ctx, c.addr, "/v1/raft/apply", &cmd, &r, false)
		return &r, err
	})
}

func (c *Client) renew(ctx context.Context, session string) (*renewResponse, error) {
	r, err := retryNotLeader(ctx, func(ctx context.Context) (*renewResponse, error) {
		var r renewResponse
		err := c.api.call(ctx, c.addr, "/v1/raft/renew", &renewRequest{Session: session}, &r, false)
		return &r, err
	})
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return nil, errSessionGone
		}
		return nil, err
	}
	return r, nil
}

func (c *Client) loadState(ctx context.Context, name string) (stateView, error) {
	q := url.Values{"name": {name}}
	return retryNotLeader(ctx, func(ctx context.Context) (stateView, error) {
		var v stateView
		err := c.api.call(ctx, c.addr, "/v1/raft/state?"+q.Encode(), nil, &v, false)
		return v, err
	})
}

func (c *Client) read(ctx context.Context, name, session string, stale bool) (leaseView, error) {
	q := url.Values{"name": {name}, "session": {session}}
	if stale {
		q.Set("stale", "1")
	}
	return retryNotLeader(ctx, func(ctx context.Context) (leaseView, error) {
		var v leaseView
		err := c.api.call(ctx, c.addr, "/v1/raft/lease?"+q.Encode(), nil, &v, false)
		return v, err
	})
}

// wait long-polls the agent's copy of the log.
func (c *Client) wait(ctx context.Context, name, session string, minIndex, after uint64) (leaseView, error) {
	for {
		q := url.Values{"name": {name}, "session": {session}, "stale": {"1"},
			"min": {fmt.Sprint(minIndex)}, "after": {fmt.Sprint(after)}, "wait": {"30s"}}
		var v leaseView
		err := c.api.call(ctx, c.addr, "/v1/raft/lease?"+q.Encode(), nil, &v, false)
		switch {
		case ctx.Err() != nil:
			return leaseView{}, ctx.Err()
		case err != nil:
			// The agent restarting, say: try again shortly. The session's
			// renewals, not this wait, decide whether terms survive.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return leaseView{}, ctx.Err()
			case <-t.C:
			}
		case v.Index >= minIndex && (v.Modified > after || v.SessionGone):
			return v, nil
		}
	}
}

func (c *Client) member() string { return "agent " + c.addr }

func (c *Client) witness() bool { return false }
