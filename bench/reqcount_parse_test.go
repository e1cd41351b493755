package bench

import (
	"bytes"
	"encoding/binary"
	"io"
	"maps"
	"net/http"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// feed writes b to a new tap of newTap in pieces of every size from 1 up,
// so that frames and messages straddle writes, and closes it, as the proxy
// does when the connection ends (which waits for the parse).
func feed(t *testing.T, newTap func() io.Writer, b []byte) {
	t.Helper()
	w := newTap()
	for step := 1; len(b) > 0; step++ {
		n := min(step, len(b))
		if _, err := w.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	if c, ok := w.(io.Closer); ok {
		c.Close()
	}
}

// checkCounts compares what c counted with want.
func checkCounts(t *testing.T, c *reqCounter, want map[string]int64) {
	t.Helper()
	if got := c.snapshot(); !maps.Equal(got, want) {
		t.Errorf("counted %v, want %v", got, want)
	}
	if err := c.err(); err != nil {
		t.Errorf("parse error: %v", err)
	}
}

func TestZKTapCountsPackets(t *testing.T) {
	var b bytes.Buffer
	packet := func(body []byte) {
		_ = binary.Write(&b, binary.BigEndian, int32(len(body)))
		b.Write(body)
	}
	request := func(xid, op int32, rest int) {
		body := binary.BigEndian.AppendUint32(nil, uint32(xid))
		body = binary.BigEndian.AppendUint32(body, uint32(op))
		packet(append(body, make([]byte, rest)...))
	}
	packet(make([]byte, 44)) // ConnectRequest
	request(1, 9, 10)        // sync
	request(-2, 11, 0)       // ping
	request(2, 9, 3)
	request(3, 12, 20) // getChildren2
	request(4, 999, 0)
	c := newReqCounter()
	feed(t, zkTap(c), b.Bytes())
	checkCounts(t, c, map[string]int64{"connect": 1, "sync": 2, "ping": 1, "getChildren2": 1, "op 999": 1})

	// A connection that asks a four-letter word counts once.
	c = newReqCounter()
	feed(t, zkTap(c), []byte("srvr"))
	checkCounts(t, c, map[string]int64{"4lw srvr": 1})
}

func TestGRPCTapCountsMessages(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	headers := func(stream uint32, path string) {
		hb.Reset()
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":path", Value: path}, {Name: "content-type", Value: "application/grpc"}} {
			_ = enc.WriteField(f)
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(n int) []byte {
		return append([]byte{0, 0, 0, 0, byte(n)}, make([]byte, n)...)
	}
	_ = fr.WriteSettings()
	headers(1, "/etcdserverpb.Lease/LeaseKeepAlive")
	// Three messages in two frames, the second split across them.
	stream := append(append(msg(3), msg(7)...), msg(0)...)
	_ = fr.WriteData(1, false, stream[:10])
	_ = fr.WriteData(1, false, stream[10:])
	headers(3, "/etcdserverpb.KV/Txn")
	_ = fr.WriteData(3, true, msg(12))
	_ = fr.WritePing(false, [8]byte{1})
	_ = fr.WritePing(true, [8]byte{2}) // an ack: the server's ping, answered
	_ = fr.WriteData(1, true, msg(1))
	c := newReqCounter()
	feed(t, grpcTap(c), b.Bytes())
	checkCounts(t, c, map[string]int64{"Lease/LeaseKeepAlive": 4, "KV/Txn": 1, h2Ping: 1})
}

func TestHTTPTapCountsRequests(t *testing.T) {
	var b bytes.Buffer
	for _, r := range []struct{ method, target, body string }{
		{"PUT", "/v1/session/renew/0b7c1f0e-aaaa-bbbb-cccc-1234567890ab", ""},
		{"GET", "/v1/kv/baton/x?index=42&wait=60000ms", ""},
		{"GET", "/v1/kv/baton/x?index=0", ""},
		{"PUT", "/v1/kv/baton/x?acquire=0b7c1f0e", "holder"},
		{"GET", "/v1/kv/baton/?recurse=&index=7", ""},
	} {
		req, err := http.NewRequest(r.method, "http://127.0.0.1:8500"+r.target, bytes.NewBufferString(r.body))
		if err != nil {
			t.Fatal(err)
		}
		if err := req.Write(&b); err != nil {
			t.Fatal(err)
		}
	}
	c := newReqCounter()
	feed(t, httpTap(c), b.Bytes())
	checkCounts(t, c, map[string]int64{
		"PUT /v1/session/renew/ID":          1,
		"GET /v1/kv/KEY (blocking)":         1,
		"GET /v1/kv/KEY":                    1,
		"PUT /v1/kv/KEY?acquire":            1,
		"GET /v1/kv/KEY?recurse (blocking)": 1,
	})
}
