package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// raftTestSecret is the group secret of the multi-process raft tests here.
const raftTestSecret = "views-test-secret-0123456789"

// raftMaterial makes a CA in dir/ca and a certificate per name in dir
// (NAME.pem, NAME-key.pem) with `baton tls`.
func raftMaterial(t *testing.T, dir string, names ...string) {
	t.Helper()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	for _, name := range names {
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name); r.code != 0 {
			t.Fatalf("tls cert %s: %d %s", name, r.code, r.stderr)
		}
	}
}

// memberArgs are the member flags of NAME (its certificate from raftMaterial)
// binding bind and finding its peers at join.
func memberArgs(dir, name, bind string, join []string, expect int) []string {
	return []string{"--bind", bind, "--join", "static:" + strings.Join(join, ","), "--bootstrap-expect", fmt.Sprint(expect),
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem")}
}

// getJSON GETs url and decodes its JSON body into v; false when the call
// failed or answered another status than 200.
func getJSON(url string, v any) bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
}

// is-leader and leader read from the --http of a `baton run --backend
// raft://`, as they read from an agent, with the same exit statuses: 0
// this instance leads / printed the holder, 1 another does or nobody, 3
// nobody answers. No second daemon runs.
func TestIsLeaderReadsRunHTTP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raftMaterial(t, dir, "m1")
	bind, httpAddr := freePort(t), freePort(t)
	run := startBaton(t, "m1", testEnv("BATON_SECRET="+raftTestSecret),
		append(append([]string{"run", "--backend", "raft://", "--lease", "job", "--id", "m1", "--voters", "1", "--http", httpAddr},
			memberArgs(dir, "m1", bind, []string{bind}, 1)...), "--", "sleep", "600")...)
	backend := "agent://" + httpAddr
	testkit.Eventually(t, 60*time.Second, "is-leader --id m1 through run --http to say 0", func() bool {
		return runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m1").code == 0
	})
	if r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m2", "-v"); r.code != 1 || !strings.Contains(r.stdout, "holder=m1") {
		t.Errorf("is-leader --id m2 through run --http: exit %d %q %s, want 1 naming holder m1", r.code, r.stdout, r.stderr)
	}
	r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "job", "--json")
	var doc leaderJSON
	if err := json.Unmarshal([]byte(r.stdout), &doc); r.code != 0 || err != nil || doc.Holder == nil || *doc.Holder != "m1" || doc.Token == "" {
		t.Errorf("leader --json through run --http: exit %d %q %s, want 0 with holder m1 and a token", r.code, r.stdout, r.stderr)
	}
	// The token is the one the run's own lease view shows.
	var view struct {
		Token string `json:"token"`
	}
	if !getJSON("http://"+httpAddr+"/v1/leases/job", &view) || view.Token != doc.Token {
		t.Errorf("leader printed token %s, the run's /v1/leases/job says %s", doc.Token, view.Token)
	}
	if r := runBaton(t, 30*time.Second, "leader", "--backend", backend, "--lease", "nobody-holds-this"); r.code != 1 || !strings.Contains(r.stderr, "nobody holds") {
		t.Errorf("leader of a free lease through run --http: exit %d %s, want 1 saying nobody holds it", r.code, r.stderr)
	}
	_ = run.cmd.Process.Signal(syscall.SIGKILL)
	run.wait(t, 30*time.Second)
	if r := runBaton(t, 30*time.Second, "is-leader", "--backend", backend, "--lease", "job", "--id", "m1", "--timeout", "2s"); r.code != 3 {
		t.Errorf("is-leader with the run gone: exit %d %s, want 3 (undetermined)", r.code, r.stderr)
	}
}

// A `baton run --http` on another backend than raft serves no reads for
// agent://, and says so, naming its backend.
func TestIsLeaderRunHTTPNotRaft(t *testing.T) {
	t.Parallel()
	httpAddr := freePort(t)
	startBaton(t, "mem", testEnv(), "run", "--backend", "memory://", "--lease", "job", "--id", "m1", "--http", httpAddr, "--", "sleep", "600")
	testkit.Eventually(t, 30*time.Second, "the run to lead", func() bool {
		var h struct{ Status string }
		return getJSON("http://"+httpAddr+"/v1/health/leader", &h) && h.Status == "leader"
	})
	r := runBaton(t, 30*time.Second, "is-leader", "--backend", "agent://"+httpAddr, "--lease", "job", "--id", "m1", "--timeout", "3s")
	if r.code == 0 || !strings.Contains(r.stderr, "not a member of a raft group") || !strings.Contains(r.stderr, "memory://") {
		t.Errorf("is-leader through a memory:// run's --http: exit %d %s, want a failure naming the run's backend", r.code, r.stderr)
	}
}
