package zookeeper

import (
	"strings"
	"testing"
)

// srvrAnswers are srvr answers as ZooKeeper 3.8 gives them.
var srvrAnswers = map[string]string{
	"standalone": "Zookeeper version: 3.8.4-9316c2a7a97e1666d8f4593f34dd6fc36ecc436c, built on 2024-02-12 22:16 UTC\nLatency min/avg/max: 0/0.4074/9\nReceived: 1077\nSent: 1076\nConnections: 3\nOutstanding: 0\nZxid: 0x1f\nMode: standalone\nNode count: 12\n",
	"follower":   "Zookeeper version: 3.8.4\nLatency min/avg/max: 0/0.0/0\nReceived: 3\nSent: 2\nConnections: 1\nOutstanding: 0\nZxid: 0x100000000\nMode: follower\nNode count: 5\n",
	"leader":     "Zookeeper version: 3.8.4\nMode: leader\nNode count: 5\nProposal sizes last/min/max: -1/-1/-1\n",
	"":           "srvr is not executed because it is not in the whitelist.\n",
}

func TestSrvrMode(t *testing.T) {
	for want, out := range srvrAnswers {
		if got := srvrMode(out); got != want {
			t.Errorf("srvrMode(%q) = %q, want %q", out, got, want)
		}
	}
	if got := srvrMode("This ZooKeeper instance is not currently serving requests\n"); got != "" {
		t.Errorf("a server out of its quorum: mode %q, want none", got)
	}
}

// FuzzSrvrMode: any answer parses without a panic, and only a "Mode:" line
// names a mode.
func FuzzSrvrMode(f *testing.F) {
	for _, out := range srvrAnswers {
		f.Add(out)
	}
	f.Fuzz(func(t *testing.T, out string) {
		if mode := srvrMode(out); mode != "" && !strings.Contains(out, "Mode:") {
			t.Fatalf("srvrMode(%q) = %q without a Mode line", out, mode)
		}
	})
}

// FuzzFrames: frames splits a stream the same way whatever the chunks it
// comes in, and never panics on garbage.
func FuzzFrames(f *testing.F) {
	f.Add([]byte{0, 0, 0, 8, 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 11, 0, 0, 0, 0}, uint8(3))
	f.Add([]byte{0, 0, 0, 20, 1, 2, 3}, uint8(1))
	f.Fuzz(func(t *testing.T, stream []byte, chunk uint8) {
		var whole, split []string
		var a, b frames
		a.feed(stream, func(first bool, head []byte) { whole = append(whole, string(head)) })
		step := int(chunk)%7 + 1
		for i := 0; i < len(stream); i += step {
			b.feed(stream[i:min(i+step, len(stream))], func(first bool, head []byte) { split = append(split, string(head)) })
		}
		if strings.Join(whole, "|") != strings.Join(split, "|") || len(whole) != len(split) {
			t.Fatalf("frames differ by chunking: %q vs %q", whole, split)
		}
		for _, h := range whole {
			if len(h) > frameHead {
				t.Fatalf("kept %d bytes of a frame, more than %d", len(h), frameHead)
			}
		}
	})
}
