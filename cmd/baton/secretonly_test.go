package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// From nothing to a first leader with one secret and one command per
// instance: three `baton run --backend raft://` members with BATON_SECRET
// and no TLS files form a group and run the command on one of them; a
// `baton agent` with the same secret joins them. A member with the wrong
// secret (which, like every member here, presents a certificate of its
// own) is refused by the live group and exits 2 saying so; one with no
// secret exits 2 before it starts.
func TestSecretOnlyGroup(t *testing.T) {
	t.Parallel()
	const lease, secret = "secret-only", "secret-only-test-0123456789abcdef"
	dir := t.TempDir()
	var binds, https []string
	for range 3 {
		binds, https = append(binds, freePort(t)), append(https, freePort(t))
	}
	join := "static:" + strings.Join(binds, ",")
	env := testEnv("BATON_SECRET=" + secret)
	for i := range 3 {
		startBaton(t, fmt.Sprintf("m%d", i+1), env, "run", "--backend", "raft://", "--bind", binds[i], "--join", join,
			"--lease", lease, "--id", fmt.Sprintf("m%d", i+1), "--http", https[i],
			"--", "sh", "-c", `echo "$BATON_HOLDER $BATON_TOKEN" > `+filepath.Join(dir, "holder")+`; exec sleep 600`)
	}
	testkit.Eventually(t, 60*time.Second, "the command running on the leader", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "holder"))
		return err == nil && len(b) > 0
	})
	leaders := 0
	for _, h := range https {
		code, _ := agentCall(t, "GET", "http://"+h+"/v1/health/leader", "")
		if code == http.StatusOK {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d members say they lead, want 1", leaders)
	}

	agentHTTP := freePort(t)
	startBaton(t, "agent", env, "agent", "--bind", freePort(t), "--join", join, "--http", agentHTTP)
	b, err := os.ReadFile(filepath.Join(dir, "holder"))
	if err != nil {
		t.Fatal(err)
	}
	holder := strings.Fields(string(b))[0]
	testkit.Eventually(t, 60*time.Second, "the agent serving the lease's holder", func() bool {
		if !agentServing(agentHTTP) {
			return false
		}
		code, body := agentCall(t, "GET", "http://"+agentHTTP+"/v1/leases/"+lease, "")
		return code == http.StatusOK && strings.Contains(body, holder)
	})

	r := runBaton(t, 60*time.Second, "run", "--backend", "raft://", "--lease", lease, "--bind", "127.0.0.1:0", "--join", join,
		"--secret", "not-the-group-secret-0123456789", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "refused this member's secret") || !strings.Contains(r.stderr, "BATON_SECRET") {
		t.Fatalf("a member with a wrong secret: exit %d, want %d with an error about the secret; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	r = runBaton(t, 60*time.Second, "run", "--backend", "raft://", "--lease", lease, "--bind", "127.0.0.1:0", "--join", join, "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "join secret is required") {
		t.Fatalf("a member with no secret: exit %d, want %d saying the secret is required; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
}
