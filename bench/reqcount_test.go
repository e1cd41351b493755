package bench

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// reqCounter counts one process's requests by type, as its server receives
// them: it is fed by a testserver.Proxy tap on each of the process's
// connections. Safe for concurrent use.
type reqCounter struct {
	mu sync.Mutex
	n  map[string]int64
	// bad records the first stream that could not be parsed: its requests
	// from there on are not counted, so the figures would be wrong.
	bad error
}

func newReqCounter() *reqCounter { return &reqCounter{n: map[string]int64{}} }

func (c *reqCounter) add(kind string) {
	c.mu.Lock()
	c.n[kind]++
	c.mu.Unlock()
}

func (c *reqCounter) fail(err error) {
	c.mu.Lock()
	if c.bad == nil {
		c.bad = err
	}
	c.mu.Unlock()
}

// snapshot returns the counts so far by request type.
func (c *reqCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

func (c *reqCounter) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bad
}

// pipeTap is a tap writer whose bytes are parsed by parse on a goroutine
// of its own, reading them as a stream; Close returns once parse has seen
// them all. If parse stops early (a stream it cannot parse), the rest is
// drained so that the proxy never blocks on it.
func pipeTap(c *reqCounter, parse func(io.Reader) error) io.WriteCloser {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := parse(pr); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			c.fail(err)
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return &parsedPipe{pw, done}
}

type parsedPipe struct {
	*io.PipeWriter
	done chan struct{}
}

func (p *parsedPipe) Close() error {
	err := p.PipeWriter.Close()
	<-p.done
	return err
}

// h2Ping is the type of the HTTP/2 PING frames a gRPC client initiates:
// grpc-go sends one to estimate the bandwidth-delay product when a response
// arrives, and one after a keep-alive time without traffic. They are shown,
// but not counted as requests: the server's HTTP/2 transport answers them
// without involving etcd.
const h2Ping = "HTTP/2 PING (transport; not counted)"

// grpcTap counts the gRPC messages a client sends over HTTP/2, by method:
// a unary call is one; on a stream (LeaseKeepAlive, Watch) each message
// sent is one, so every keep-alive counts. PING frames go under h2Ping.
func grpcTap(c *reqCounter) func() io.Writer {
	return func() io.Writer { return pipeTap(c, func(r io.Reader) error { return parseGRPC(r, c) }) }
}

func parseGRPC(r io.Reader, c *reqCounter) error {
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil {
		return err
	}
	if string(preface) != http2.ClientPreface {
		return fmt.Errorf("not an HTTP/2 client preface: %q", preface)
	}
	fr := http2.NewFramer(nil, r)
	fr.SetMaxReadFrameSize(1 << 24)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	type stream struct {
		method string
		buf    []byte // DATA not yet parsed into whole messages
	}
	streams := map[uint32]*stream{}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if _, ok := streams[f.StreamID]; !ok {
				m := f.PseudoValue("path")
				if i := strings.Index(m[1:], "."); i >= 0 {
					m = m[i+2:] // "/etcdserverpb.Lease/LeaseKeepAlive" -> "Lease/LeaseKeepAlive"
				}
				streams[f.StreamID] = &stream{method: m}
			}
			if f.StreamEnded() {
				delete(streams, f.StreamID)
			}
		case *http2.DataFrame:
			s := streams[f.StreamID]
			if s == nil {
				return fmt.Errorf("DATA on stream %d without HEADERS", f.StreamID)
			}
			// A gRPC message: a compressed flag, a 4-byte length, the
			// message; messages and frames need not line up.
			s.buf = append(s.buf, f.Data()...)
			for len(s.buf) >= 5 {
				n := 5 + int(binary.BigEndian.Uint32(s.buf[1:5]))
				if len(s.buf) < n {
					break
				}
				c.add(s.method)
				s.buf = s.buf[n:]
			}
			if f.StreamEnded() {
				delete(streams, f.StreamID)
			}
		case *http2.RSTStreamFrame:
			delete(streams, f.StreamID)
		case *http2.PingFrame:
			if !f.IsAck() {
				c.add(h2Ping)
			}
		}
	}
}

// zkOps names ZooKeeper's opcodes (org.apache.zookeeper.ZooDefs.OpCode).
var zkOps = map[int32]string{
	1: "create", 2: "delete", 3: "exists", 4: "getData", 5: "setData", 6: "getACL",
	7: "setACL", 8: "getChildren", 9: "sync", 11: "ping", 12: "getChildren2",
	13: "check", 14: "multi", 15: "create2", 16: "reconfig", 17: "checkWatches",
	18: "removeWatches", 19: "createContainer", 20: "deleteContainer", 21: "createTTL",
	22: "multiRead", -11: "closeSession", 100: "auth", 101: "setWatches", 102: "sasl",
	103: "getEphemerals", 104: "getAllChildrenNumber", 105: "setWatches2",
	106: "addWatch", 107: "whoAmI",
}

// zkTap counts the request packets a ZooKeeper client sends, by opcode,
// pings included: each is a 4-byte length and then the packet; the first on
// a connection is the ConnectRequest (no opcode), the others start with an
// xid and an opcode.
func zkTap(c *reqCounter) func() io.Writer {
	return func() io.Writer { return &zkParser{c: c} }
}

type zkParser struct {
	c          *reqCounter
	buf        []byte
	connected  bool
	fourLetter bool
}

// isFourLetterWord reports whether b, a connection's first four bytes, is
// a four-letter word rather than the length of a connect request.
func isFourLetterWord(b []byte) bool {
	for _, c := range b {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

func (z *zkParser) Write(p []byte) (int, error) {
	if z.fourLetter {
		return len(p), nil
	}
	z.buf = append(z.buf, p...)
	// A connection that opens with four lowercase letters asks a
	// four-letter word (baton's probe asks srvr of each server it dials),
	// the one thing it sends.
	if !z.connected && len(z.buf) >= 4 && isFourLetterWord(z.buf[:4]) {
		z.c.add("4lw " + string(z.buf[:4]))
		z.fourLetter, z.buf = true, nil
		return len(p), nil
	}
	for len(z.buf) >= 4 {
		n := 4 + int(binary.BigEndian.Uint32(z.buf))
		if len(z.buf) < n {
			break
		}
		pkt := z.buf[4:n]
		switch {
		case !z.connected:
			z.c.add("connect")
			z.connected = true
		case len(pkt) < 8:
			z.c.fail(fmt.Errorf("ZooKeeper packet of %d bytes", len(pkt)))
		default:
			op := int32(binary.BigEndian.Uint32(pkt[4:8]))
			name, ok := zkOps[op]
			if !ok {
				name = fmt.Sprintf("op %d", op)
			}
			z.c.add(name)
		}
		z.buf = z.buf[n:]
	}
	return len(p), nil
}

// httpTap counts the HTTP/1.1 requests a Consul client sends, by method and
// path with the variable parts (keys, session IDs) replaced; a blocking
// query (one with ?index=) is one request however long the server holds
// it, and is marked as such.
func httpTap(c *reqCounter) func() io.Writer {
	return func() io.Writer {
		return pipeTap(c, func(r io.Reader) error {
			br := bufio.NewReader(r)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return err
				}
				c.add(consulRequestKind(req))
				if _, err := io.Copy(io.Discard, req.Body); err != nil {
					return err
				}
			}
		})
	}
}

// consulRequestKind names a Consul API request: "GET /v1/kv/KEY (blocking)",
// "PUT /v1/session/renew/ID", "PUT /v1/kv/KEY?acquire".
func consulRequestKind(r *http.Request) string {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/v1/kv/"):
		p = "/v1/kv/KEY"
	case strings.HasPrefix(p, "/v1/session/"):
		if parts := strings.SplitN(p, "/", 5); len(parts) == 5 { // "", v1, session, renew, ID
			p = strings.Join(parts[:4], "/") + "/ID"
		}
	}
	q := r.URL.Query()
	for _, flag := range []string{"acquire", "release", "cas", "recurse", "keys"} {
		if q.Has(flag) {
			p += "?" + flag
			break
		}
	}
	kind := r.Method + " " + p
	if q.Get("index") != "" && q.Get("index") != "0" {
		kind += " (blocking)"
	}
	return kind
}
