package bench

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func TestRedisTapCountsCommands(t *testing.T) {
	c := newReqCounter()
	feed(t, redisTap(c), []byte("*1\r\n$4\r\nping\r\n"+
		"*4\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n1\r\n$5\r\nk\r\nxy\r\n"+ // a bulk string holding CRLF
		"*2\r\n$9\r\nSUBSCRIBE\r\n$14\r\nbaton:released\r\n"+
		"PING\r\n"))
	checkCounts(t, c, map[string]int64{"PING": 1, "EVALSHA": 1, "SUBSCRIBE": 1, "inline PING": 1})
}

func TestPGTapCountsStatements(t *testing.T) {
	var b bytes.Buffer
	msg := func(typ byte, parts ...string) {
		var body []byte
		for _, p := range parts {
			body = append(append(body, p...), 0)
		}
		b.WriteByte(typ)
		_ = binary.Write(&b, binary.BigEndian, int32(len(body)+4))
		b.Write(body)
	}
	// SSLRequest, then the startup message.
	_ = binary.Write(&b, binary.BigEndian, [2]int32{8, 80877103})
	startup := append(binary.BigEndian.AppendUint32(nil, 196608), "user\x00u\x00\x00"...)
	_ = binary.Write(&b, binary.BigEndian, int32(len(startup)+4))
	b.Write(startup)
	msg('Q', "-- ping")
	msg('P', "stmt1", "SELECT l.holder FROM leases l WHERE l.name = $1", "")
	msg('B', "", "stmt1", "")
	msg('E', "", "")
	msg('S')
	msg('B', "", "stmt1", "")
	msg('B', "", "unknown", "")
	c := newReqCounter()
	feed(t, pgTap(c), b.Bytes())
	checkCounts(t, c, map[string]int64{"-- ping": 1, "SELECT l.holder FROM leases l WHERE": 2, "EXECUTE ?": 1})
}
