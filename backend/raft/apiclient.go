package raft

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// maxForwarded bounds the calls a member has in flight to the raft leader
// at once, session renewals and leaving aside: each call in flight holds a
// connection, and each new connection costs both members a TLS handshake
// and a proof of the secret, so a process starting a thousand campaigns at
// once would otherwise open a thousand. It matches the idle connections
// the member keeps (newAPIClient), so that a burst reuses them.
const maxForwarded = 64

// forwardJSON posts (or, with a nil body, gets) path on the raft leader.
// Every call but a session renewal (its own or an agent client's) and a
// leave waits for one of maxForwarded turns first: a renewal must never
// wait behind campaigns.
func (n *Node) forwardJSON(ctx context.Context, path string, body, out any) error {
	if path != "/v1/raft/renew" && path != "/v1/raft/leave" {
		select {
		case n.forwards <- struct{}{}:
			defer func() { <-n.forwards }()
		case <-ctx.Done():
			return fmt.Errorf("raft: waiting for one of %d calls to the raft leader to end: %w", maxForwarded, context.Cause(ctx))
		}
	}
	addr, _ := n.raft.LeaderWithID()
	if addr == "" {
		return ErrNotLeader
	}
	if string(addr) == n.addr {
		return ErrNotLeader // we are it, but not ready yet
	}
	return n.client.call(ctx, string(addr), path, body, out, true)
}

// apiClient calls peers' group API.
type apiClient struct {
	mu     sync.Mutex
	secret string // the bearer token sent with each call (agent clients); see bearer
	hc     *http.Client
	tr     *http.Transport // nil when hc is the caller's
	scheme string          // "https" (members, over the mux) or "http" (agent clients)
}

// newAPIClient calls members' group API over connections that prove the
// group's secret (dialProto with cr). Its calls carry no bearer token: the
// mux hands a connection to the group API only after its proof held.
func newAPIClient(cr *creds, g *gate) *apiClient {
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dialProto(ctx, cr, g, addr, protoAPI)
		},
		// Enough idle connections for a burst of concurrent calls (a
		// process campaigning for many leases at once) to reuse theirs:
		// each new one costs a TLS handshake and a proof of the secret,
		// and on a busy host a storm of them starves the raft RPCs and
		// the renewals that share the process.
		MaxIdleConnsPerHost: maxForwarded,
		IdleConnTimeout:     time.Minute,
	}
	return &apiClient{tr: tr, hc: &http.Client{Transport: tr}, scheme: "https"}
}

func (c *apiClient) close() {
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
}

// call does one request to the member at addr. A nil body makes it a GET,
// with path carrying any query.
func (c *apiClient) call(ctx context.Context, addr, path string, body, out any, forwarded bool) error {
	method := http.MethodGet
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		method, rd = http.MethodPost, bytes.NewReader(b)
	}
	u := url.URL{Scheme: c.scheme, Host: addr}
	req, err := http.NewRequestWithContext(ctx, method, u.String()+path, rd)
	if err != nil {
		return err
	}
	if tok := c.bearer(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if forwarded {
		req.Header.Set(forwardedHeader, "1")
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotLeader, addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotLeader, addr, err)
	}
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %s: %s", ErrNotLeader, addr, bytes.TrimSpace(b))
	case resp.StatusCode != http.StatusOK:
		return &apiError{Status: resp.StatusCode, Msg: string(bytes.TrimSpace(b))}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// bearer returns the token sent with each call.
func (c *apiClient) bearer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.secret
}

// setBearer replaces the token sent with later calls.
func (c *apiClient) setBearer(tok string) {
	c.mu.Lock()
	c.secret = tok
	c.mu.Unlock()
}
