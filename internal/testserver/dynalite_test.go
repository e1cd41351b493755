package testserver

import (
	"fmt"
	"net"
	"testing"
)

// A client that hangs up in the middle of a request (a cancelled context,
// a killed process, a fault proxy) must not take the emulator down with it:
// DynamoDB survives that, and every test sharing the emulator would fail.
func TestDynaliteSurvivesAbortedRequest(t *testing.T) {
	d := StartDynalite(t)
	for i := range 3 {
		c, err := net.Dial("tcp", d.Addr)
		if err != nil {
			t.Fatal(err)
		}
		// Announce a body and close before sending all of it.
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-amz-json-1.0\r\n"+
			"X-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 1000\r\n\r\n{\"Lim", d.Addr)
		c.(*net.TCPConn).SetLinger(0) // a reset, as a killed client's kernel sends
		c.Close()
		if err := d.CreateTable(fmt.Sprintf("table%d", i), "k"); err != nil {
			t.Fatalf("after an aborted request %d: %v\noutput:\n%s", i, err, d.Out)
		}
	}
}
