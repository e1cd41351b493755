package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// counterClock is a clock that advances 1 ms per reading, so that every
// write gets a distinct time and receive order can be checked against At.
func counterClock() func() time.Duration {
	var n atomic.Int64
	return func() time.Duration { return time.Duration(n.Add(1)) * time.Millisecond }
}

// serve starts s on a fresh Unix socket and returns the socket's path and a
// client that dials it; both are closed at the end of the test.
func serve(t *testing.T, s *Store) (string, *http.Client) {
	t.Helper()
	dir, err := os.MkdirTemp("", "store")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return sock, &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// post sends body and returns the status and the body of the answer.
func post(t *testing.T, c *http.Client, body string) (int, string) {
	t.Helper()
	resp, err := c.Post("http://store"+WritePath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func writeBody(cand string, token uint64, pid int, seq int64) string {
	return fmt.Sprintf(`{"candidate":%q,"token":"%d","pid":%d,"seq":%d}`, cand, token, pid, seq)
}

func TestFencingRule(t *testing.T) {
	s := New(counterClock())
	_, c := serve(t, s)
	if _, ok := s.Last(); ok || s.Highest() != 0 {
		t.Fatalf("empty store: Last ok=%v, Highest %d", ok, s.Highest())
	}
	steps := []struct {
		cand   string
		token  uint64
		status int
	}{
		{"c1", 5, 200},
		{"c1", 5, 200}, // one term writes many times
		{"c2", 7, 200},
		{"c1", 5, 409}, // the old term, late: refused
		{"c1", 6, 409},
		{"c2", 7, 200},
		{"c3", 1 << 63, 200}, // tokens above 2^53 survive the wire
	}
	for i, st := range steps {
		code, body := post(t, c, writeBody(st.cand, st.token, 100+i, int64(i+1)))
		if code != st.status {
			t.Fatalf("step %d (%s, %d): status %d, want %d (%s)", i, st.cand, st.token, code, st.status, body)
		}
		var r Response
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			t.Fatalf("step %d: answer %q: %v", i, body, err)
		}
		if r.Accepted != (st.status == 200) {
			t.Fatalf("step %d: answer %+v for status %d", i, r, code)
		}
	}
	ws := s.Writes()
	if len(ws) != len(steps) {
		t.Fatalf("%d writes recorded, want %d", len(ws), len(steps))
	}
	for i, w := range ws {
		st := steps[i]
		if w.Candidate != st.cand || w.Token != st.token || w.PID != 100+i || w.Seq != int64(i+1) || w.Accepted != (st.status == 200) {
			t.Errorf("write %d recorded as %+v", i, w)
		}
		if i > 0 && w.At <= ws[i-1].At {
			t.Errorf("write %d at %s, not after write %d at %s", i, w.At, i-1, ws[i-1].At)
		}
	}
	if s.Highest() != 1<<63 {
		t.Errorf("Highest = %d, want 2^63", s.Highest())
	}
	last, ok := s.Last()
	if !ok || last.Candidate != "c3" || last.Token != 1<<63 {
		t.Errorf("Last = %+v, %v; want c3's write", last, ok)
	}
	if a, r := s.Counts(); a != 5 || r != 2 {
		t.Errorf("Counts = %d accepted, %d refused; want 5, 2", a, r)
	}
	// Last is the last accepted write, not the last write.
	post(t, c, writeBody("c1", 5, 1, 99))
	if last, _ := s.Last(); last.Candidate != "c3" {
		t.Errorf("after a refused write, Last = %+v; want c3's", last)
	}
}

func TestBadRequests(t *testing.T) {
	s := New(counterClock())
	_, c := serve(t, s)
	for _, tc := range []struct{ body, want string }{
		{`garbage`, "not a write"},
		{``, "not a write"},
		{`{"candidate":"c1","pid":1,"seq":1}`, `missing "token"`},
		{`{"candidate":"c1","token":"x","pid":1,"seq":1}`, "not a decimal uint64"},
		{`{"candidate":"c1","token":"-1","pid":1,"seq":1}`, "not a decimal uint64"},
		{`{"candidate":"c1","token":"18446744073709551616","pid":1,"seq":1}`, "not a decimal uint64"},
		{`{"candidate":"c1","token":5,"pid":1,"seq":1}`, "not a write"},
		{`{"token":"1","pid":1,"seq":1}`, `missing "candidate"`},
		{`{"candidate":"c1","token":"1","seq":1}`, `"pid"`},
		{`{"candidate":"c1","token":"1","pid":1}`, `"seq"`},
		{`{"candidate":"c1","token":"1","pid":1,"seq":1,"extra":true}`, "unknown field"},
		{`{"candidate":"c1","token":"1","pid":1,"seq":1}{}`, "more than one JSON value"},
		{strings.Repeat(" ", maxRequest+1), "reading the body"},
	} {
		code, body := post(t, c, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(body, tc.want) {
			t.Errorf("body %.40q: %d %q; want 400 naming %q", tc.body, code, body, tc.want)
		}
	}
	resp, err := c.Get("http://store" + WritePath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
	if n := len(s.Writes()); n != 0 {
		t.Errorf("%d bad requests recorded as writes", n)
	}
}

// TestConcurrentWriters has many writers race with rising tokens: whatever
// the interleaving, the store must never accept a token below one it
// accepted earlier, and must record every write in At order.
func TestConcurrentWriters(t *testing.T) {
	var logBuf syncBuffer
	s := New(counterClock(), WithLog(&logBuf))
	_, c := serve(t, s)
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				tok := uint64(i*writers + w)
				code, body := post(t, c, writeBody(fmt.Sprintf("c%d", w), tok, 1000+w, int64(i+1)))
				if code != 200 && code != 409 {
					t.Errorf("writer %d: %d %s", w, code, body)
				}
			}
		})
	}
	wg.Wait()
	ws := s.Writes()
	if len(ws) != writers*each {
		t.Fatalf("%d writes recorded, want %d", len(ws), writers*each)
	}
	var highest uint64
	accepted := 0
	for i, w := range ws {
		if i > 0 && w.At <= ws[i-1].At {
			t.Fatalf("write %d not after write %d", i, i-1)
		}
		if w.Accepted != (w.Token >= highest) {
			t.Fatalf("write %d (token %d, highest %d) accepted=%v", i, w.Token, highest, w.Accepted)
		}
		if w.Accepted {
			highest = w.Token
			accepted++
		}
	}
	if s.Highest() != highest {
		t.Errorf("Highest = %d, want %d", s.Highest(), highest)
	}
	if a, r := s.Counts(); a != accepted || r != len(ws)-accepted {
		t.Errorf("Counts = %d, %d; want %d, %d", a, r, accepted, len(ws)-accepted)
	}
	// The log holds the same writes, in the same order; a line cut short
	// at the end is dropped.
	logged := logBuf.Bytes()
	back, err := ReadLog(bytes.NewReader(append(logged, `{"at":1,"cand`...)))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back, ws) {
		t.Errorf("ReadLog gave %d writes, not the %d recorded", len(back), len(ws))
	}
	if _, err := ReadLog(strings.NewReader(string(logged[:40]) + "\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("ReadLog of a broken line: %v; want an error naming line 1", err)
	}
}

// syncBuffer is a bytes.Buffer safe for the test to read while the store
// writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.b.Bytes())
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, fmt.Errorf("disk full") }

func TestLogErrorReported(t *testing.T) {
	s := New(counterClock(), WithLog(failWriter{}))
	rec := &recorder{header: http.Header{}}
	req, err := http.NewRequest(http.MethodPost, WritePath, strings.NewReader(writeBody("c1", 1, 1, 1)))
	if err != nil {
		t.Fatal(err)
	}
	s.Handler().ServeHTTP(rec, req)
	if rec.code != 200 {
		t.Fatalf("write: %d %s", rec.code, rec.body.String())
	}
	if err := s.Close(); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close = %v; want the log's error", err)
	}
}

// recorder is a minimal http.ResponseWriter.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = 200
	}
	return r.body.Write(p)
}
func (r *recorder) WriteHeader(code int) { r.code = code }

// TestChildKeepsWritingWhenRefused runs two Children against a real store:
// the one with the lower token is refused and must go on writing, with Seq
// counting from 1 and its own PID.
func TestChildKeepsWritingWhenRefused(t *testing.T) {
	s := New(counterClock())
	sock, _ := serve(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errs atomic.Int64
	run := func(cand string, tok uint64) chan error {
		done := make(chan error, 1)
		go func() {
			done <- Child{Socket: sock, Candidate: cand, Token: tok, Every: 5 * time.Millisecond,
				Errors: func(error) { errs.Add(1) }}.Run(ctx)
		}()
		return done
	}
	high := run("c2", 9)
	// The low child starts once the high token is in, so all its writes are
	// refused.
	testkit.Eventually(t, 10*time.Second, "the highest token 9", func() bool { return s.Highest() == 9 })
	low := run("c1", 3)
	testkit.Eventually(t, 10*time.Second, "5 rejections counted", func() bool { _, r := s.Counts(); return r >= 5 })
	cancel()
	for _, d := range []chan error{high, low} {
		if err := <-d; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	seq := map[string]int64{}
	for _, w := range s.Writes() {
		if w.PID != os.Getpid() {
			t.Errorf("write %+v: PID %d, want %d", w, w.PID, os.Getpid())
		}
		if w.Seq != seq[w.Candidate]+1 {
			t.Errorf("%s: seq %d after %d", w.Candidate, w.Seq, seq[w.Candidate])
		}
		seq[w.Candidate] = w.Seq
		if w.Candidate == "c1" && w.Accepted {
			t.Errorf("the stale child's write was accepted: %+v", w)
		}
	}
	if n := errs.Load(); n != 0 {
		t.Errorf("%d write errors; a refusal is not an error", n)
	}
}

func TestChildInvalid(t *testing.T) {
	for _, c := range []Child{{Candidate: "c1"}, {Socket: "/x"}, {Socket: "/x", Candidate: "c", Every: -1}} {
		if err := c.Run(context.Background()); err == nil {
			t.Errorf("%+v: Run = nil, want an error", c)
		}
	}
}

// TestChildStoreGone: a child whose store is unreachable reports errors and
// keeps going until its context ends.
func TestChildStoreGone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- Child{Socket: filepath.Join(t.TempDir(), "none"), Candidate: "c1", Token: 1, Every: time.Millisecond,
			Errors: func(error) { n.Add(1) }}.Run(ctx)
	}()
	testkit.Eventually(t, 10*time.Second, "3 errors reported", func() bool { return n.Load() >= 3 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
}

// FuzzParseRequest: parsing any body never panics, and a body it accepts
// is a valid write that survives a round trip.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		writeBody("c1", 42, 1234, 1),
		`{"candidate":"c1","token":"18446744073709551615","pid":1,"seq":9223372036854775807}`,
		`{"candidate":"","token":"1","pid":1,"seq":1}`,
		`{"token":null}`, `[]`, `null`, `{"candidate":"c1","token":"01","pid":1,"seq":1}`,
		"\x00\xff", `{"candidate":"\u00e9","token":"1","pid":2147483648,"seq":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		w, err := parseRequest(body)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		if w.candidate == "" || len(w.candidate) > maxCandidate || w.pid <= 0 || w.seq <= 0 {
			t.Fatalf("accepted invalid write %+v from %q", w, body)
		}
		b, err := json.Marshal(Request{Candidate: w.candidate, Token: strconv.FormatUint(w.token, 10), PID: w.pid, Seq: w.seq})
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseRequest(b)
		if err != nil || again != w {
			t.Fatalf("round trip of %+v: %+v, %v", w, again, err)
		}
	})
}
