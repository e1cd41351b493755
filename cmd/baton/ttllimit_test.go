package main

import (
	"strings"
	"testing"

	"github.com/batonhq/baton/internal/testserver"
)

// TestRunTTLAtBackendLimits runs `baton run --once` against each backend's
// real server at the longest TTL the backend takes, which must work, and
// just above it, which must be a usage error (exit 2) naming --ttl and the
// limit, never a campaign retried forever as an outage: etcd's maximum
// lease TTL (a limit of etcd's own, checked before connecting, and mapped
// from the server's refusal too), Consul's session TTLs of at most 24 h
// (the session TTL is TTL/2), the session timeout ZooKeeper negotiates
// (the server clamps it into its [minSessionTimeout, maxSessionTimeout]
// and cannot grant what a TTL above the maximum needs), a Lease's
// leaseDurationSeconds (an int32 of seconds). raft:// and memory:// have
// no limit: the longest Duration works.
func TestRunTTLAtBackendLimits(t *testing.T) {
	t.Parallel()
	const maxDuration = "2562047h47m16.854775807s"
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) (args []string, env map[string]string)
		ttl     string
		want    []string // nil: the run works
	}{
		{"etcd max", etcdArgs, "9000000000s", nil},
		{"etcd above max", etcdArgs, "9000000001s", []string{"--ttl 2500000h0m1s", "etcd's maximum lease TTL", "9000000000 s"}},
		{"etcd largest duration", etcdArgs, "2562047h", []string{"--ttl 2562047h0m0s", "etcd's maximum lease TTL"}},
		{"consul max", consulArgs, "48h", nil},
		{"consul above max", consulArgs, "48h0m0.002s", []string{"--ttl 48h0m0.002s", "above 24h0m0s", "at most 48h0m0s"}},
		{"consul below min", consulArgs, (3 * testserver.ConsulSessionTTLMin / 2).String(), []string{"--ttl " + (3 * testserver.ConsulSessionTTLMin / 2).String(), "session_ttl_min", "set TTL to at least twice"}},
		{"zookeeper max", zkArgs, testserver.ZooKeeperMaxSessionTimeout.String(), nil},
		{"zookeeper above max session timeout", zkArgs, "10m", []string{"--ttl 10m0s", "granted a session timeout of " + testserver.ZooKeeperMaxSessionTimeout.String(), "maxSessionTimeout"}},
		{"zookeeper above 32-bit milliseconds", zkArgs, "600h", []string{"--ttl 600h0m0s", "32-bit milliseconds"}},
		{"kubernetes max", k8sArgs, "2147483647s", nil},
		{"kubernetes above max", k8sArgs, "2147483648s", []string{"--ttl 596523h14m8s", "leaseDurationSeconds is an int32 of seconds"}},
		{"raft max", raftArgs, "30s", nil},
		{"raft above max", raftArgs, maxDuration, []string{"above the group's longest, 30s", "--max-ttl"}},
		// baton.fence sets statement_timeout to the TTL: at most 2^31-1 ms.
		{"postgres max", pgArgs, "2147483647ms", nil},
		{"postgres above max", pgArgs, "2147483648ms", []string{"--ttl 596h31m23.648s", "statement_timeout", "2147483647 ms"}},
		{"memory largest duration", func(*testing.T) ([]string, map[string]string) { return []string{"--backend", "memory://"}, nil }, maxDuration, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			backend, env := tc.backend(t)
			args := append(append([]string{"run"}, backend...), "--lease", "limits", "--ttl", tc.ttl, "--timeout", "60s", "--once", "--", "true")
			r := runApp(t.Context(), env, args...)
			if tc.want == nil {
				if r.code != 0 {
					t.Fatalf("--ttl %s: exit %d, want 0; stderr:\n%s", tc.ttl, r.code, r.stderr)
				}
				return
			}
			checkUsageError(t, r, tc.want)
			if strings.Contains(r.stderr, "campaign failed; retrying") {
				t.Errorf("the refused TTL was retried as an outage:\n%s", r.stderr)
			}
		})
	}
}

func pgArgs(t *testing.T) ([]string, map[string]string) {
	return []string{"--backend", pgURL(t)}, nil
}

func etcdArgs(t *testing.T) ([]string, map[string]string) {
	return []string{"--backend", etcdURL(t)}, nil
}

func consulArgs(t *testing.T) ([]string, map[string]string) {
	return []string{"--backend", consulURL(t, "/ttl-limits")}, nil
}

func zkArgs(t *testing.T) ([]string, map[string]string) {
	return []string{"--backend", "zk://" + testserver.SharedZooKeeper(t).Addr() + "/ttl-limits-" + strings.ReplaceAll(t.Name(), "/", "-")}, nil
}

// k8sArgs names a namespace of the subtest's own, which kubeconfigFor makes,
// and a kubeconfig for it.
func k8sArgs(t *testing.T) ([]string, map[string]string) {
	ns := strings.ToLower(strings.ReplaceAll(t.Name()[strings.LastIndexByte(t.Name(), '/')+1:], "_", "-"))
	// In the URL: client-go reads KUBECONFIG from the process's
	// environment, which an in-process run does not replace.
	return []string{"--backend", "k8s://" + ns + "?kubeconfig=" + kubeconfigFor(t, ns)}, nil
}

func raftArgs(t *testing.T) ([]string, map[string]string) {
	args := raftMemberArgs(t)
	// raftMemberArgs ends with --lease x; the test names its own.
	return append([]string{"--bind", freePort(t)}, args[:len(args)-2]...), map[string]string{"BATON_SECRET": "ttl-limits-test-secret-0123456789"}
}
