package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/certs"
)

// The BenchmarkTenThousandCandidates worker of the embedded raft group: the
// benchmark process runs the group's three voters (raftTarget's group, at
// the default timings), and each worker process is a member of its own
// that joins as a non-voter, as the fourth and later processes of a group
// do, with its candidates' Backend on it. Its traffic is TLS between
// members, so it is counted where it is served: the Group calls that the
// raft leader served (raftCounter), for all workers together.

func init() {
	candBackends = append(candBackends, candBackend{name: "raft", start: candRaft, backends: candRaftBackends})
}

// workerSeq numbers the certificates of the raft workers.
var workerSeq atomic.Int64

func candRaft(b *testing.B) candServer {
	counts := installRaftCounter(b)
	g := newRaftGroup(b)
	g.startVoters(b, 3)
	dir := b.TempDir()
	if err := g.ca.WriteCert(filepath.Join(dir, "ca.pem")); err != nil {
		b.Fatal(err)
	}
	g.mu.Lock()
	peers := strings.Join(g.voters, "\n")
	g.mu.Unlock()
	if err := os.WriteFile(filepath.Join(dir, "peers"), []byte(peers), 0o644); err != nil {
		b.Fatal(err)
	}
	return candServer{
		dir: dir,
		prepare: func(spec *candSpec) error {
			name := fmt.Sprintf("w%d", workerSeq.Add(1))
			cert, key, err := g.ca.Issue(name, []string{"127.0.0.1"}, 0)
			if err != nil {
				return err
			}
			spec.Cert = filepath.Join(dir, name)
			return certs.WritePair(spec.Cert+".pem", spec.Cert+"-key.pem", cert, key)
		},
		server: func() map[string]int64 {
			return map[string]int64{"raft Apply": counts.apply.Load(), "raft VerifyLeader": counts.verifyLeader.Load()}
		},
	}
}

func candRaftBackends(spec candSpec) (func() (baton.Backend, error), func(), error) {
	tlsCfg, err := certs.Load(certs.Files{CA: filepath.Join(spec.Dir, "ca.pem"), Cert: spec.Cert + ".pem", Key: spec.Cert + "-key.pem"})
	if err != nil {
		return nil, nil, err
	}
	n, err := raft.StartNode(raft.NodeOptions{BindAddr: "127.0.0.1:0", TLS: tlsCfg, Secret: "0123456789abcdef-bench-secret",
		Discovery: filePeers(filepath.Join(spec.Dir, "peers"))})
	if err != nil {
		return nil, nil, err
	}
	<-n.Joined()
	return func() (baton.Backend, error) {
		return raft.New(n, raft.Options{Config: backend.Config{TTL: spec.TTL}})
	}, func() {}, nil
}
