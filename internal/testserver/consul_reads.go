package testserver

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// ConsulReads is an http.RoundTripper for a Consul API client that records,
// for each recursive KV read (GET with ?recurse), how many entries its
// answer held, and which prefixes are being read at the moment (a watcher's
// blocking queries). Other requests pass through untouched.
type ConsulReads struct {
	rt http.RoundTripper

	mu       sync.Mutex
	answers  []int
	entries  int64
	inFlight map[string]int // recursive reads waiting for their answer, by path
}

// NewConsulReads returns a ConsulReads that sends requests through a clone
// of http.DefaultTransport.
func NewConsulReads() *ConsulReads {
	return &ConsulReads{rt: http.DefaultTransport.(*http.Transport).Clone(), inFlight: map[string]int{}}
}

// RoundTrip sends r and, for a recursive read, counts its answer's entries.
func (c *ConsulReads) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet || !r.URL.Query().Has("recurse") {
		return c.rt.RoundTrip(r)
	}
	c.mu.Lock()
	c.inFlight[r.URL.Path]++
	c.mu.Unlock()
	resp, err := c.rt.RoundTrip(r)
	c.mu.Lock()
	if c.inFlight[r.URL.Path]--; c.inFlight[r.URL.Path] == 0 {
		delete(c.inFlight, r.URL.Path)
	}
	c.mu.Unlock()
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	n := bytes.Count(body, []byte(`"Key"`))
	c.mu.Lock()
	c.answers = append(c.answers, n)
	c.entries += int64(n)
	c.mu.Unlock()
	return resp, nil
}

// Answers returns how many recursive reads have been answered.
func (c *ConsulReads) Answers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.answers)
}

// AnswersSince returns the sizes (entries) of the answers after the first n.
func (c *ConsulReads) AnswersSince(n int) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.answers[n:]...)
}

// Entries returns the entries in all answers so far.
func (c *ConsulReads) Entries() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries
}

// Prefixes returns how many prefixes are being read now (blocking queries
// waiting for a change).
func (c *ConsulReads) Prefixes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.inFlight)
}
