package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

// DefaultEvery is how often a Child writes when Every is zero.
const DefaultEvery = 20 * time.Millisecond

// DefaultTimeout bounds one write of a Child when Timeout is zero: short, so
// that a store that stalls costs a few beats, not the loop.
const DefaultTimeout = 500 * time.Millisecond

// Child is the writer a candidate's child runs: it writes to the store every
// Every with its term's token until its context ends. A refused write does
// not stop it: a stale child that keeps trying is exactly what fencing must
// stop, so it goes on writing. Errors reaching the store do not stop it
// either (the store may be slow, or the child may be cut off); they are
// lost writes, which the checker sees as gaps in Seq.
type Child struct {
	// Socket is the path of the store's Unix socket. Required.
	Socket string
	// Candidate is the id of the `baton run` that started this child.
	// Required.
	Candidate string
	// Token is the term's fencing token (BATON_TOKEN).
	Token uint64
	// Every is the time between writes; zero means DefaultEvery.
	Every time.Duration
	// Timeout bounds each write; zero means DefaultTimeout.
	Timeout time.Duration
	// Errors, if not nil, receives the error of each write that did not
	// reach the store or got an answer other than 200 or 409. Nil discards
	// them. It is called from Run's goroutine.
	Errors func(error)
}

// Run writes every Every, Seq counting from 1 and PID os.Getpid(), until ctx
// is done; the first write goes at once. It returns nil when ctx ends, and an
// error only for a Child that is not valid.
func (c Child) Run(ctx context.Context) error {
	if c.Socket == "" {
		return errors.New("store: child: Socket is empty; give the path of the store's Unix socket")
	}
	if c.Candidate == "" {
		return errors.New("store: child: Candidate is empty; give the candidate's id")
	}
	if c.Every < 0 || c.Timeout < 0 {
		return fmt.Errorf("store: child: Every (%s) and Timeout (%s) must not be negative", c.Every, c.Timeout)
	}
	every, timeout := c.Every, c.Timeout
	if every == 0 {
		every = DefaultEvery
	}
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.Socket)
		},
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: timeout}

	req := Request{Candidate: c.Candidate, Token: strconv.FormatUint(c.Token, 10), PID: os.Getpid()}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		req.Seq++
		if err := c.write(ctx, client, req); err != nil && ctx.Err() == nil && c.Errors != nil {
			c.Errors(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// write sends one write; a refusal (409) is an answer, not an error.
func (c Child) write(ctx context.Context, client *http.Client, r Request) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	// The host is ignored: the transport dials the socket.
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://store"+WritePath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hreq)
	if err != nil {
		return fmt.Errorf("store: write %d: %w", r.Seq, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	switch resp.StatusCode {
	case http.StatusOK, http.StatusConflict:
		return nil
	default:
		return fmt.Errorf("store: write %d: %s: %s", r.Seq, resp.Status, bytes.TrimSpace(msg))
	}
}
