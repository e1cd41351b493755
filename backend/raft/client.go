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
	"path/filepath"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/agentsock"
)

// ClientOptions configures a Client. The zero value means the defaults.
type ClientOptions struct {
	// Token is the agent's bearer token (`baton agent` --http-token, or
	// the token file it writes at start). Every call that changes something
	// needs it; without it, only reads work. It is sent only to an agent
	// reached on its Unix socket and proved (see Dial).
	Token string
	// TokenSource, when set, gives the token instead of Token: at Dial, and
	// again each time the agent refuses the one sent, so that a client
	// follows an agent that restarted with a new token (`baton agent`
	// writes a new random one to its token file at every start). Nil (the
	// default) means Token, always.
	TokenSource func() (string, error)
	// HTTPClient makes the calls over TCP (PlainTCP). Nil (the default)
	// means a client of its own; a Client on a Unix socket always uses its
	// own, which checks the server.
	HTTPClient *http.Client
	// PlainTCP lets a Client of an agent at HOST:PORT send the token and
	// its sessions' secrets over TCP, where nothing proves that whatever
	// answers is the agent: a process of any user that binds the port of
	// a crashed agent would get them. For tests, and for a connection the
	// caller secures itself. False (the default): over TCP the Client
	// sends no credential, so only reads work, and calls that need one
	// fail with ErrUnprovenAgent.
	PlainTCP bool
}

// ErrUnprovenAgent is the error of a Client call that needs a credential
// (the agent's token, a session's secret) when the agent is reached over
// TCP without ClientOptions.PlainTCP: nothing was sent. Such an error also
// matches *baton.ConfigError, since no retry fixes it: an Elector returns
// it rather than campaigning again.
var ErrUnprovenAgent = errors.New("raft: no credential is sent to an agent reached over TCP")

// unproven returns the error of a call that needs a credential on c, which
// has no proved server.
func (c *Client) unproven() error {
	return fmt.Errorf("%w: %w", ErrUnprovenAgent, &baton.ConfigError{Problems: []string{fmt.Sprintf(
		"the agent at %s is reached over TCP, where nothing proves that whatever answers is the agent: reach it on its Unix socket, from the agent's host (agent:///PATH, e.g. agent:///run/baton/agent-127.0.0.1-8790.sock, or agent://127.0.0.1:PORT), or make this host a member of the group (raft://)", c.addr)}})
}

// Client is a Group that campaigns through a local agent (`baton agent`)
// instead of being a member itself: the agent's member forwards its calls
// to the raft leader. Each session it creates has a secret of its own,
// which the agent checks on every call about the session, so another
// process that learns the session's ID (the lease table shows it) cannot
// act on it. Safe for concurrent use.
//
// A Client believes no server about time: a renewal's reply can shorten
// its sessions' safe-until, never put it past the renewal's send time +
// the Client's own TTL − DriftMargin (see backend.Config.SafeUntil).
type Client struct {
	addr   string // the agent's socket path or HOST:PORT, for messages
	host   string // the URL host of the calls
	api    *apiClient
	source func() (string, error) // ClientOptions.TokenSource
	// proven is true on a Unix socket (each connection checked by
	// agentsock.Dial) or with ClientOptions.PlainTCP: only then are
	// credentials sent.
	proven bool
	// key derives each session's secret from its ID (secret), so that a
	// create retried after a lost reply presents the same secret.
	key [32]byte
}

var _ Group = (*Client)(nil)

// Dial returns a Client of the agent at addr: the absolute path of its
// Unix socket (`baton agent` --socket), or HOST:PORT of its HTTP address
// (reads only, unless ClientOptions.PlainTCP). It does not connect yet. On
// the socket, every connection first proves the server (package
// internal/agentsock: the socket's directory is writable only by its owner,
// and the process serving it runs as that owner or as root); a server
// that cannot prove it gets no credential.
func Dial(addr string, opts ClientOptions) (*Client, error) {
	c := &Client{addr: addr, source: opts.TokenSource}
	var hc *http.Client
	if filepath.IsAbs(addr) {
		hc = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				conn, err := agentsock.Dial(ctx, addr)
				if err != nil {
					return nil, fmt.Errorf("raft: the agent's socket %s: %w", addr, err)
				}
				return conn, nil
			},
			MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute,
		}}
		c.host, c.proven = "agent", true
	} else {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("raft: agent address %q: want the agent's socket path (/run/baton/agent-127.0.0.1-8790.sock) or HOST:PORT", addr)
		}
		hc = opts.HTTPClient
		if hc == nil {
			hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}}
		}
		c.host, c.proven = addr, opts.PlainTCP
	}
	tok := opts.Token
	if opts.TokenSource != nil {
		var err error
		if tok, err = opts.TokenSource(); err != nil {
			return nil, fmt.Errorf("raft: the agent's token: %w", err)
		}
	}
	if !c.proven {
		tok = ""
	}
	c.api = &apiClient{secret: tok, hc: hc, scheme: "http"}
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
	if !c.proven {
		return nil, c.unproven()
	}
	req := clientRequest{Op: cmd.Op, Session: cmd.Session, Secret: c.secret(cmd.Session), TTL: cmd.TTL,
		Lease: cmd.Lease, Candidate: cmd.Candidate, Token: cmd.Token, Reason: cmd.Reason, Value: cmd.Value}
	return retryNotLeader(ctx, func(ctx context.Context) (*result, error) {
		var r result
		err := c.api.call(ctx, c.host, "/v1/raft/client/apply", &req, &r, false)
		if ae := (*apiError)(nil); errors.As(err, &ae) && ttlRefusal(ae) != nil {
			return nil, ttlRefusal(ae)
		}
		return &r, c.authErr(err)
	})
}

func (c *Client) renew(ctx context.Context, session string) (*renewResponse, error) {
	if !c.proven {
		return nil, c.unproven()
	}
	req := renewRequest{Session: session, Secret: c.secret(session)}
	r, err := retryNotLeader(ctx, func(ctx context.Context) (*renewResponse, error) {
		var r renewResponse
		err := c.api.call(ctx, c.host, "/v1/raft/client/renew", &req, &r, false)
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
		if c.source != nil && c.proven {
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
		err := c.api.call(ctx, c.host, "/v1/raft/state?"+q.Encode(), nil, &v, false)
		return v, err
	})
}

func (c *Client) read(ctx context.Context, name, session string, stale bool) (leaseView, error) {
	q := url.Values{"name": {name}, "session": {session}}
	if stale {
		q.Set("stale", "1")
	}
	v, err := retryNotLeader(ctx, func(ctx context.Context) (leaseView, error) {
		var v leaseView
		err := c.api.call(ctx, c.host, "/v1/raft/lease?"+q.Encode(), nil, &v, false)
		return v, err
	})
	if ae := (*apiError)(nil); errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		// Whatever answers there serves no reads of a raft group (a
		// `baton run` on another backend, say): asking again cannot help.
		return v, &baton.ConfigError{Problems: []string{fmt.Sprintf(
			"%s serves no reads of a raft group (GET /v1/raft/lease: 404 %s): point agent:// at the --http of a baton agent or of a baton run --backend raft://",
			c.addr, ae.Msg)}}
	}
	return v, err
}

func (c *Client) readMany(ctx context.Context, names []string, stale bool) ([]leaseView, error) {
	vs, err := retryNotLeader(ctx, func(ctx context.Context) ([]leaseView, error) {
		var vs []leaseView
		err := c.api.call(ctx, c.host, "/v1/raft/read", &readManyRequest{Names: names, Stale: stale}, &vs, false)
		return vs, err
	})
	if notServed(err) {
		// An agent of a version without the call: one read each.
		return readEach(ctx, names, func(ctx context.Context, name string) (leaseView, error) { return c.read(ctx, name, "", stale) })
	}
	return checkViews(vs, names, err)
}

// heldLost long-polls the agent: which of session's terms (lease name to
// token) its copy of the log, once it applied index minIndex, no longer
// gives them; none when wait ran out first.
func (c *Client) heldLost(ctx context.Context, session string, terms map[string]uint64, minIndex uint64, wait time.Duration) ([]string, error) {
	var resp heldResponse
	err := c.api.call(ctx, c.host, "/v1/raft/held", &heldRequest{Session: session, Terms: terms, Min: minIndex, Wait: wait.String()}, &resp, false)
	return resp.Lost, err
}

// wait long-polls the agent's copy of the log.
func (c *Client) wait(ctx context.Context, name, session string, minIndex, after uint64) (leaseView, error) {
	for {
		q := url.Values{"name": {name}, "session": {session}, "stale": {"1"},
			"min": {fmt.Sprint(minIndex)}, "after": {fmt.Sprint(after)}, "wait": {"30s"}}
		var v leaseView
		err := c.api.call(ctx, c.host, "/v1/raft/lease?"+q.Encode(), nil, &v, false)
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
