package raft

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// ClientOptions configures a Client. The zero value means the defaults.
type ClientOptions struct {
	// Token is the agent's bearer token (`baton agent` --http-token, or
	// the token file it writes at start). Every call that changes
	// something needs it; without it, only reads work.
	Token string
	// TokenSource, when set, gives the token instead of Token: at Dial, and
	// again each time the agent refuses the one sent, so that a client
	// follows an agent that restarted with a new token (`baton agent`
	// writes a new random one to its token file at every start). Nil (the
	// default) means Token, always.
	TokenSource func() (string, error)
	// HTTPClient makes the calls. Nil (the default) means a client of its
	// own.
	HTTPClient *http.Client
}

// Client is a Group that campaigns through a local agent (`baton agent`)
// instead of being a member itself: the agent's member forwards its calls
// to the raft leader. Each session it creates has a secret of its own,
// which the agent checks on every call about the session, so another
// process that learns the session's ID (the lease table shows it) cannot
// act on it. Safe for concurrent use.
type Client struct {
	addr   string
	api    *apiClient
	source func() (string, error) // ClientOptions.TokenSource
	// key derives each session's secret from its ID (secret), so that a
	// create retried after a lost reply presents the same secret.
	key [32]byte
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
	tok := opts.Token
	if opts.TokenSource != nil {
		var err error
		if tok, err = opts.TokenSource(); err != nil {
			return nil, fmt.Errorf("raft: the agent's token: %w", err)
		}
	}
	c := &Client{addr: addr, api: &apiClient{secret: tok, hc: hc, scheme: "http"}, source: opts.TokenSource}
	_, _ = rand.Read(c.key[:]) // crypto/rand.Read never fails on Linux since Go 1.24
	return c, nil
}

// secret returns the secret of session, one of this Client's.
func (c *Client) secret(session string) string {
	m := hmac.New(sha256.New, c.key[:])
	m.Write([]byte(session))
	return hex.EncodeToString(m.Sum(nil))
}

func (c *Client) apply(ctx context.Context, cmd command) (*result, error) {
	req := clientRequest{Op: cmd.Op, Session: cmd.Session, Secret: c.secret(cmd.Session), TTL: cmd.TTL,
		Lease: cmd.Lease, Candidate: cmd.Candidate, Token: cmd.Token, Reason: cmd.Reason, Value: cmd.Value}
	return retryNotLeader(ctx, func(ctx context.Context) (*result, error) {
		var r result
		err := c.api.call(ctx, c.addr, "/v1/raft/client/apply", &req, &r, false)
		return &r, c.authErr(err)
	})
}

func (c *Client) renew(ctx context.Context, session string) (*renewResponse, error) {
	req := renewRequest{Session: session, Secret: c.secret(session)}
	r, err := retryNotLeader(ctx, func(ctx context.Context) (*renewResponse, error) {
		var r renewResponse
		err := c.api.call(ctx, c.addr, "/v1/raft/client/renew", &req, &r, false)
		return &r, c.authErr(err)
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

// authErr explains a refused token.
func (c *Client) authErr(err error) error {
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
		sent := c.api.bearer()
		if c.source != nil {
			// An agent that restarted has a new token: the next call
			// sends it.
			if tok, serr := c.source(); serr == nil && tok != sent {
				c.api.setBearer(tok)
				return fmt.Errorf("the agent at %s refused the token given; read its token again, for the next call: %w", c.addr, err)
			}
		}
		if sent == "" {
			return fmt.Errorf("the agent at %s wants its token, and none was given (`baton agent` writes it to a file at start; see its --http-token-file): %w", c.addr, err)
		}
		return fmt.Errorf("the agent at %s refused the token given: %w", c.addr, err)
	}
	return err
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
