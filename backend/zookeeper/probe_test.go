package zookeeper

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// frame returns body behind its 4-byte length.
func frame(body ...[]byte) []byte {
	var b []byte
	for _, part := range body {
		b = append(b, part...)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func be32(v int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }
func be64(v int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(v)) }

// TestProbePairsRepliesByXid: the probe confirms a request's send time
// only on the server's error-free reply with that request's xid; a frame
// that answers nothing sent (a dropped ping's included), a watch event or
// an error confirms nothing.
func TestProbePairsRepliesByXid(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	dials := 0
	p := NewSessionProbe(func(string, string, time.Duration) (net.Conn, error) {
		if dials++; dials > 1 {
			return nil, errors.New("no srvr here")
		}
		return client, nil
	})
	c, err := p.Dial("tcp", "pipe", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The server reads whatever the client writes.
	go func() { _, _ = io.Copy(io.Discard, server) }()
	reply := func(b []byte) {
		t.Helper()
		go func() { _, _ = server.Write(b) }()
		if _, err := io.ReadFull(c, make([]byte, len(b))); err != nil {
			t.Fatal(err)
		}
	}
	write := func(b []byte) time.Time {
		t.Helper()
		before := time.Now()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		return before
	}
	answered := func() time.Time {
		l, ok := p.link(7)
		if !ok {
			t.Fatal("the probe has not seen session 7")
		}
		if l.standalone {
			t.Fatal("standalone without a srvr answer")
		}
		return l.answered
	}

	write(frame(make([]byte, 44))) // the connect request
	reply(frame(be32(0), be32(2000), be64(7), be32(16), make([]byte, 16), []byte{0}))
	if got, ok := p.Negotiated(7); !ok || got != 2*time.Second {
		t.Fatalf("negotiated %s, %v; want 2s", got, ok)
	}
	t1 := write(frame(be32(1), be32(9), make([]byte, 6))) // sync, xid 1
	t2 := write(frame(be32(3), be32(4), make([]byte, 6))) // getData, xid 3
	t3 := write(frame(be32(2), be32(3), make([]byte, 6))) // exists, xid 2

	reply(frame(be32(99), be64(0), be32(0))) // answers nothing sent
	reply(frame(be32(-1), be64(0), be32(0), make([]byte, 12)))
	if got := answered(); !got.IsZero() {
		t.Fatalf("answered %s before any reply to a request", got)
	}
	reply(frame(be32(1), be64(5), be32(0)))
	if got := answered(); got.Before(t1) || !got.Before(t2) {
		t.Fatalf("answered %s after the sync's reply; want its send time (after %s, before %s)", got, t1, t2)
	}
	reply(frame(be32(3), be64(5), be32(0)))
	if got := answered(); got.Before(t2) || !got.Before(t3) {
		t.Fatalf("answered %s after getData's reply; want its send time (t1 %s t2 %s t3 %s)", got, t1, t2, t3)
	}
	// A ping right after other requests is dropped (see quietPings), so
	// a ping reply answers nothing sent.
	write(pingPacket)
	reply(frame(be32(-2), be64(5), be32(0)))
	if got := answered(); got.After(t3) {
		t.Fatalf("a dropped ping was confirmed at %s", got)
	}
	reply(frame(be32(2), be64(5), be32(-101))) // NoNode
	if got := answered(); !got.Before(t3) {
		t.Fatalf("an error reply moved answered to %s", got)
	}
}
