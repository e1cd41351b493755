package zookeeper

import (
	"io"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// askStandalone reports whether the ZooKeeper server at address runs
// standalone, by asking it the four-letter word srvr on a connection of
// its own (dialed as the client's are) and reading "Mode: standalone" in
// the answer. ZooKeeper answers srvr whatever its four-letter-word
// whitelist says, since its own scripts depend on it; a server that does
// not answer within timeout, or gives another mode, counts as a member of
// an ensemble, which is the cautious guess (see ensembleLag).
func askStandalone(dial zk.Dialer, network, address string, timeout time.Duration) bool {
	if timeout <= 0 {
		timeout = time.Second
	}
	c, err := dial(network, address, timeout)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("srvr")); err != nil {
		return false
	}
	// The server closes the connection after its answer; a deadline that
	// ends the read leaves what came before it.
	out, _ := io.ReadAll(io.LimitReader(c, 4096))
	return srvrMode(string(out)) == "standalone"
}

// srvrMode returns the value of the "Mode:" line of a srvr answer
// ("standalone", "leader", "follower", "observer", "read-only"), or ""
// when there is none.
func srvrMode(out string) string {
	for line := range strings.SplitSeq(out, "\n") {
		if mode, ok := strings.CutPrefix(strings.TrimSpace(line), "Mode:"); ok {
			return strings.TrimSpace(mode)
		}
	}
	return ""
}
