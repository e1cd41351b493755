package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestUsageErrors runs each bad input in-process and checks that it exits 2
// with a message that says what is wrong and how to fix it.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	ok := []string{"--backend", "memory://", "--lease", "x"}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want []string // substrings of stderr
	}{
		{"raft recover without flags", nil,
			[]string{"raft", "recover"},
			[]string{"--member is required", "--lost is required", "the group's join secret is required", "BATON_SECRET"}},
		{"raft recover bad addresses", map[string]string{"BATON_SECRET": "0123456789abcdef-secret"},
			[]string{"raft", "recover", "--member", "10.0.0.5", "--lost", "10.0.0.6:7390,10.0.0.7:x", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"},
			[]string{`--member "10.0.0.5"`, "HOST:PORT", `--lost "10.0.0.7:x"`}},
		{"raft recover max-ttl", nil,
			[]string{"run", "--backend", "raft://", "--max-ttl", "0s", "--lease", "x", "--", "true"},
			[]string{"--max-ttl 0s", "positive duration"}},
		{"unknown scheme", nil,
			[]string{"run", "--backend", "mysql://h:3306", "--lease", "x", "--", "true"},
			[]string{`unknown backend scheme "mysql"`, "supported are", "etcd://host:port", "zk://host:port", "consul://host:port", "memory://"}},
		{"no scheme", nil,
			[]string{"is-leader", "--backend", "localhost:2379", "--lease", "x"},
			[]string{"not a backend URL", "etcd://localhost:2379"}},
		{"garbage", nil,
			[]string{"is-leader", "--backend", "%%%", "--lease", "x"},
			[]string{`--backend "%%%"`, "not a backend URL", "etcd://"}},
		{"etcd without host", nil,
			[]string{"is-leader", "--backend", "etcd://", "--lease", "x"},
			[]string{"no etcd endpoint", "etcd://127.0.0.1:2379"}},
		{"etcd port out of range", nil,
			[]string{"is-leader", "--backend", "etcd://h:99999", "--lease", "x"},
			[]string{`port "99999"`, "1 to 65535", "etcd://host:port"}},
		{"etcd port not a number", nil,
			[]string{"is-leader", "--backend", "etcd://h1:2379,h2:http", "--lease", "x"},
			[]string{`endpoint "h2:http"`, `port "http"`}},
		{"etcd empty endpoint", nil,
			[]string{"is-leader", "--backend", "etcd://h1:2379,:2379", "--lease", "x"},
			[]string{`endpoint ":2379" has no host`}},
		{"etcd with path", nil,
			[]string{"is-leader", "--backend", "etcd://h:2379/x", "--lease", "x"},
			[]string{"no path", "etcd://host:port"}},
		{"memory with host", nil,
			[]string{"is-leader", "--backend", "memory://h", "--lease", "x"},
			[]string{"use memory://"}},
		{"etcd lease with slash", nil,
			[]string{"is-leader", "--backend", "etcd://h:2379", "--lease", "a/b"},
			[]string{`--lease "a/b"`, `must not contain "/"`}},
		{"zk bad port", nil,
			[]string{"is-leader", "--backend", "zk://h:99999/x", "--lease", "x"},
			[]string{`port "99999"`, "1 to 65535", "zk://"}},
		{"zk no server", nil,
			[]string{"is-leader", "--backend", "zk://", "--lease", "x"},
			[]string{"no ZooKeeper server", "zk://127.0.0.1:2181"}},
		{"zk bad root", nil,
			[]string{"is-leader", "--backend", "zk://h:2181/a//b", "--lease", "x"},
			[]string{`path "/a//b"`, "zk://"}},
		{"zk unknown parameter", nil,
			[]string{"is-leader", "--backend", "zk://h:2181/x?colour=red", "--lease", "x"},
			[]string{`unknown query parameter "colour"`, "ca-file"}},
		{"zk user without password", nil,
			[]string{"is-leader", "--backend", "zk://svc@h:2181/x", "--lease", "x"},
			[]string{"user:password@"}},
		{"zk half a client certificate", nil,
			[]string{"is-leader", "--backend", "zk://h:2181/x?cert-file=c.pem", "--lease", "x"},
			[]string{"cert-file and key-file go together"}},
		{"zk lease with slash", nil,
			[]string{"is-leader", "--backend", "zk://h:2181", "--lease", "a/b"},
			[]string{`--lease "a/b"`, `must not contain "/"`}},
		{"zk missing CA file", nil,
			[]string{"is-leader", "--backend", "zk://127.0.0.1:2181/x?ca-file=/nonexistent/ca.pem", "--lease", "x"},
			[]string{"ca-file", "/nonexistent/ca.pem"}},
		{"consul two agents", nil,
			[]string{"is-leader", "--backend", "consul://h1:8500,h2:8500", "--lease", "x"},
			[]string{"one agent", "consul://127.0.0.1:8500"}},
		{"consul token in URL", nil,
			[]string{"is-leader", "--backend", "consul://h:8500?token=s3cret", "--lease", "x"},
			[]string{"token", "CONSUL_HTTP_TOKEN"}},
		{"consul unknown parameter", nil,
			[]string{"is-leader", "--backend", "consul://h:8500?colour=red", "--lease", "x"},
			[]string{`"colour"`, "ca-file"}},
		{"consul bad prefix", nil,
			[]string{"is-leader", "--backend", "consul://h:8500/a//b", "--lease", "x"},
			[]string{`path "/a//b"`, "clean"}},
		{"consul unclean lease", nil,
			[]string{"is-leader", "--backend", "consul://h:8500", "--lease", "a/../b"},
			[]string{`--lease "a/../b"`, "clean path"}},
		{"consul missing token file", nil,
			[]string{"is-leader", "--backend", "consul://127.0.0.1:8500?token-file=/nonexistent/token", "--lease", "x"},
			[]string{"token-file", "/nonexistent/token"}},
		{"etcd host with a stray %", nil,
			[]string{"is-leader", "--backend", "etcd://%zz", "--lease", "x"},
			[]string{`server "%zz"`, "contains '%'", "etcd://host:port"}},
		{"etcd host with an IPv6 zone", nil,
			[]string{"is-leader", "--backend", "etcd://[fe80::1%lo]:2379", "--lease", "x"},
			[]string{"IPv6 zone %lo", "not supported", "etcd://host:port"}},
		{"etcd host with an escaped IPv6 zone", nil,
			[]string{"is-leader", "--backend", "etcd://[fe80::1%25lo]:2379", "--lease", "x"},
			[]string{"IPv6 zone %lo", "not supported"}},
		{"etcd password with a stray %", nil,
			[]string{"is-leader", "--backend", "etcd://user:pa%zz@h:2379", "--lease", "x"},
			[]string{"password", "write a literal % as %25", "user:xxxxx@h"}},
		{"zk host not ASCII", nil,
			[]string{"is-leader", "--backend", "zk://h\u00e9:2181", "--lease", "x"},
			[]string{"not ASCII", "punycode"}},
		{"zk query with a stray %", nil,
			[]string{"is-leader", "--backend", "zk://h:2181/x?ca-file=%zz", "--lease", "x"},
			[]string{`query "ca-file=%zz"`, "write a literal % as %25"}},
		{"agent host with a stray %", nil,
			[]string{"is-leader", "--backend", "agent://h%zz:8790", "--lease", "x"},
			[]string{"contains '%'", "agent://"}},
		{"consul with a password", nil,
			[]string{"is-leader", "--backend", "consul://user:pa%25zz@h:8500", "--lease", "x"},
			[]string{"no user:password@", "token-file"}},
		{"consul without host", nil,
			[]string{"is-leader", "--backend", "consul://", "--lease", "x"},
			[]string{"no Consul agent", "consul://127.0.0.1:8500"}},
		{"consul prefix without host", nil,
			[]string{"is-leader", "--backend", "consul:///services", "--lease", "x"},
			[]string{"no Consul agent", "consul://127.0.0.1:8500"}},
		{"tls ca negative validity", nil,
			[]string{"tls", "ca", "--dir", "/nonexistent/never-written", "--valid-for", "-1h"},
			[]string{"--valid-for -1h0m0s", "must be positive", "--valid-for 8760h"}},
		{"tls cert zero validity", nil,
			[]string{"tls", "cert", "--dir", "/nonexistent/never-written", "--name", "m1", "--valid-for", "0s"},
			[]string{"--valid-for 0s", "must be positive"}},
		{"missing backend", nil,
			[]string{"is-leader", "--lease", "x"},
			[]string{"--backend is required", "BATON_BACKEND"}},
		{"missing lease", nil,
			[]string{"leader", "--backend", "memory://"},
			[]string{"--lease is required", "--lease my-service", "BATON_LEASE"}},
		{"zero ttl", nil,
			append([]string{"run", "--ttl", "0"}, append(ok, "--", "true")...),
			[]string{"--ttl 0s", "must be positive", "--ttl 10s"}},
		{"negative ttl", nil,
			append([]string{"is-leader", "--ttl", "-1s"}, ok...),
			[]string{"--ttl -1s", "must be positive"}},
		{"zero ttl from env", map[string]string{"BATON_TTL": "0s"},
			append([]string{"is-leader"}, ok...),
			[]string{"BATON_TTL 0s", "must be positive"}},
		{"bad ttl from env", map[string]string{"BATON_TTL": "ten"},
			append([]string{"is-leader"}, ok...),
			[]string{`BATON_TTL="ten"`, "not a valid --ttl"}},
		{"bad ttl flag", nil,
			append([]string{"is-leader", "--ttl", "ten"}, ok...),
			[]string{`invalid argument "ten"`, "baton is-leader --help"}},
		{"cron without schedule", nil,
			append([]string{"cron"}, append(ok, "--", "true")...),
			[]string{"--schedule is required", `"0 3 * * *"`}},
		{"cron bad schedule", nil,
			append([]string{"cron", "--schedule", "61 * * * *"}, append(ok, "--", "true")...),
			[]string{`--schedule: cron spec "61 * * * *"`, "five fields"}},
		{"cron bad schedule from env", map[string]string{"BATON_SCHEDULE": "every day"},
			append([]string{"cron"}, append(ok, "--", "true")...),
			[]string{`BATON_SCHEDULE: cron spec "every day"`}},
		{"cron never fires", nil,
			append([]string{"cron", "--schedule", "0 0 30 2 *"}, append(ok, "--", "true")...),
			[]string{"never fires"}},
		{"cron bad catch-up", nil,
			append([]string{"cron", "--schedule", "@daily", "--catch-up", "all"}, append(ok, "--", "true")...),
			[]string{`--catch-up: catch-up "all"`, "want none", "or last"}},
		{"cron negative jitter", nil,
			append([]string{"cron", "--schedule", "@daily", "--jitter", "-1s"}, append(ok, "--", "true")...),
			[]string{"--jitter -1s", "must not be negative"}},
		{"cron zone without fields", nil,
			append([]string{"cron", "--schedule", "CRON_TZ=UTC"}, append(ok, "--", "true")...),
			[]string{"must be followed by a space and the fields"}},
		{"cron jitter as long as the period", nil,
			append([]string{"cron", "--schedule", "*/10 * * * * *", "--jitter", "10s"}, append(ok, "--", "true")...),
			[]string{"--jitter: jitter 10s is not shorter than the 10s between two slots"}},
		{"cron without command", nil,
			append([]string{"cron", "--schedule", "@daily"}, ok...),
			[]string{"no command to run", "baton cron --backend URL"}},
		{"cron argument before --", nil,
			append([]string{"cron", "--schedule", "@daily", "true"}, ok...),
			[]string{`unexpected argument "true"`, "baton cron --schedule SPEC"}},
		{"negative grace", nil,
			append([]string{"run", "--grace", "-1s"}, append(ok, "--", "true")...),
			[]string{"--grace -1s", "must not be negative", "--grace 2s"}},
		{"grace longer than the renewal window", nil,
			append([]string{"run", "--grace", "6s"}, append(ok, "--", "true")...),
			[]string{"--grace 6s", "must be below", "lower --grace or raise --ttl"}},
		{"negative grace from env", map[string]string{"BATON_GRACE": "-5s"},
			append([]string{"run"}, append(ok, "--", "true")...),
			[]string{"BATON_GRACE -5s", "must not be negative"}},
		{"negative run timeout", nil,
			append([]string{"run", "--timeout", "-1s"}, append(ok, "--", "true")...),
			[]string{"--timeout -1s", "0 to wait forever"}},
		{"run without command", nil,
			append([]string{"run"}, ok...),
			[]string{"no command to run", "put it after --"}},
		{"run with empty command after dash", nil,
			append([]string{"run"}, append(ok, "--")...),
			[]string{"no command to run"}},
		{"run command without dash", nil,
			append([]string{"run"}, append(ok, "sleep", "1")...),
			[]string{`unexpected argument "sleep"`, "put the command after --", "-- sleep 1"}},
		{"run command not found", nil,
			append([]string{"run"}, append(ok, "--", "no-such-command-xyz")...),
			[]string{`command "no-such-command-xyz"`, "not found", "PATH"}},
		{"unknown flag", nil,
			append([]string{"run", "--bogus"}, append(ok, "--", "true")...),
			[]string{"unknown flag: --bogus", "baton run --help"}},
		{"unknown flag of is-leader", nil,
			append([]string{"is-leader", "--json"}, ok...),
			[]string{"unknown flag: --json", "baton is-leader --help"}},
		{"positional argument", nil,
			append([]string{"is-leader", "extra"}, ok...),
			[]string{`unexpected argument "extra"`}},
		{"bad log level", nil,
			append([]string{"is-leader", "--log-level", "loud"}, ok...),
			[]string{`--log-level "loud"`, "debug, info, warn or error"}},
		{"query timeout zero", nil,
			append([]string{"leader", "--timeout", "0"}, ok...),
			[]string{"--timeout 0s", "must be positive"}},
		{"unknown command", nil,
			[]string{"elect"},
			[]string{`unknown command "elect"`, "baton --help"}},
		{"no command", nil,
			nil,
			[]string{"no command given", "run, cron, is-leader, leader, agent, tls, raft, postgres, demo, idle, version"}},
		{"demo nodes", nil,
			[]string{"demo", "--nodes", "10"},
			[]string{"--nodes 10", "3 to 9"}},
		{"demo rounds", nil,
			[]string{"demo", "--rounds", "0", "--nodes", "1"},
			[]string{"2 problems", "--rounds 0", "--nodes 1"}},
		{"run on the group's rule", nil,
			[]string{"run", "--backend", "aws-asg://web", "--lease", "x", "--", "true"},
			[]string{"--backend aws-asg://web", "for is-leader and leader only", "no lease", "no fencing token", "--backend raft:// --join aws-asg"}},
		{"cron on the group's rule from env", map[string]string{"BATON_BACKEND": "AWS-ASG://"},
			[]string{"cron", "--schedule", "@daily", "--lease", "x", "--", "true"},
			[]string{"BATON_BACKEND AWS-ASG://", "no lease", "raft:// --join aws-asg"}},
		{"rule with a query", nil,
			[]string{"is-leader", "--backend", "aws-asg://web?region=eu-west-1"},
			[]string{`"?region=eu-west-1"`, "takes no query", "AWS_REGION", "aws-asg://[GROUP]"}},
		{"rule with a path", nil,
			[]string{"leader", "--backend", "aws-asg:///web"},
			[]string{`group "/web" starts with /`, "aws-asg://NAME"}},
		{"rule with credentials in the URL", nil,
			[]string{"leader", "--backend", "aws-asg://AKID:secret@web"},
			[]string{"no user information", "AWS_*"}},
		{"rule group too long", nil,
			[]string{"leader", "--backend", "aws-asg://" + strings.Repeat("g", 256)},
			[]string{"256 bytes long", "at most 255"}},
		{"rule group with a stray %", nil,
			[]string{"leader", "--backend", "aws-asg://we%zz"},
			[]string{`group "we%zz"`, "write a literal % as %25"}},
		{"rule is-leader id not an instance", nil,
			[]string{"is-leader", "--backend", "aws-asg://web", "--id", "host/abc"},
			[]string{`--id "host/abc"`, "names an EC2 instance", "i-0123456789abcdef0"}},
		{"bad lifecycle hook name", nil,
			append([]string{"run", "--aws-lifecycle-hook", "my hook"}, append(ok, "--", "true")...),
			[]string{`--aws-lifecycle-hook "my hook"`, "1-255 letters", "EC2_INSTANCE_TERMINATING"}},
		{"reserved leader tag", nil,
			append([]string{"cron", "--schedule", "@daily", "--aws-tag", "aws:isLeader"}, append(ok, "--", "true")...),
			[]string{`--aws-tag "aws:isLeader"`, "aws:", "--aws-tag app:isLeader"}},
		{"leader label without POD_NAME", nil,
			[]string{"run", "--backend", "memory://", "--lease", "x", "--leader-label", "baton.io/leader=x", "--", "true"},
			[]string{"--leader-label needs this pod's name in POD_NAME", "fieldPath: metadata.name"}},
		{"leader label not KEY=VALUE", map[string]string{"POD_NAME": "p-1"},
			[]string{"run", "--backend", "memory://", "--lease", "x", "--leader-label", "leader", "--", "true"},
			[]string{`--leader-label "leader": want KEY=VALUE`, "baton.io/leader=my-service"}},
		{"bad leader label from env", map[string]string{"POD_NAME": "p-1", "BATON_LEADER_LABEL": "baton.io/lead er=a b"},
			[]string{"run", "--backend", "memory://", "--lease", "x", "--", "true"},
			[]string{`BATON_LEADER_LABEL: label key "baton.io/lead er"`, `BATON_LEADER_LABEL: label value "a b"`}},
		{"bad leader tag from env", map[string]string{"BATON_AWS_TAG": "has space=1"},
			append([]string{"run"}, append(ok, "--", "true")...),
			[]string{`BATON_AWS_TAG "has space=1"`}},
		{"bootstrap-expect auto without aws-asg", nil,
			[]string{"agent", "--bootstrap-expect", "auto", "--join", "static:127.0.0.1:7390"},
			[]string{"--bootstrap-expect auto counts the instances of an Auto Scaling group", "--join aws-asg"}},
		{"raft flag with another backend", nil,
			append([]string{"run", "--join", "aws-asg", "--bootstrap-expect", "auto"}, append(ok, "--", "true")...),
			[]string{"--bootstrap-expect is a raft flag", "memory://", "--backend raft://"}},
		{"raft flags on cron with etcd", nil,
			[]string{"cron", "--schedule", "@daily", "--backend", "etcd://127.0.0.1:2379", "--lease", "x", "--voters", "5", "--join", "static:10.0.0.1", "--", "true"},
			[]string{"2 problems", "--voters is a raft flag", "--join is a raft flag", "etcd://"}},
		{"bootstrap-expect neither number nor auto", nil,
			[]string{"agent", "--bootstrap-expect", "many"},
			[]string{`invalid argument "many"`, "number of members or auto"}},
		{"agent with a leader tag", nil,
			[]string{"agent", "--aws-tag", "app:isLeader"},
			[]string{"--aws-tag: an agent campaigns for nothing itself", "baton run or cron"}},
		{"every problem at once", nil,
			[]string{"run", "--backend", "etcd://", "--ttl", "0", "--grace", "-1s"},
			[]string{"5 problems", "no etcd endpoint", "--lease is required", "--ttl 0s", "--grace -1s", "no command to run"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := runApp(t.Context(), tt.env, tt.args...)
			checkUsageError(t, r, tt.want)
		})
	}
}

// checkUsageError checks that r is a usage error (exit 2, nothing on
// stdout) whose message mentions every string of want and does not show
// the password "pa%zz" that the tests put in URLs.
func checkUsageError(t *testing.T, r result, want []string) {
	t.Helper()
	if r.code != exitUsage {
		t.Errorf("exit status %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
		}
	}
	if r.stdout != "" {
		t.Errorf("stdout should be empty on a usage error, got:\n%s", r.stdout)
	}
	if strings.Contains(r.stderr, "pa%zz") || strings.Contains(r.stderr, "pa%25zz") {
		t.Errorf("stderr shows the password of the URL:\n%s", r.stderr)
	}
}

// TestFlagWinsOverEnv checks the precedence of BATON_* variables, through
// is-leader on the memory backend, where nobody leads (exit 1) but the
// configuration is valid.
func TestFlagWinsOverEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{"BATON_BACKEND": "memory://", "BATON_LEASE": "x", "BATON_TTL": "0s", "BATON_LOG_LEVEL": "loud"}
	r := runApp(t.Context(), env, "is-leader", "--ttl", "5s", "--log-level", "warn", "--verbose")
	if r.code != exitFailure {
		t.Fatalf("exit status %d, want 1 (valid configuration, no leader); stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, `not leader: nobody holds lease "x"`) {
		t.Errorf("--verbose output: %q", r.stdout)
	}
	r = runApp(t.Context(), env, "is-leader", "--ttl", "5s")
	if r.code != exitUsage || !strings.Contains(r.stderr, "BATON_LOG_LEVEL") {
		t.Errorf("bad BATON_LOG_LEVEL: exit %d, stderr %q", r.code, r.stderr)
	}
	// A flag given as an empty string is still given.
	r = runApp(t.Context(), env, "is-leader", "--ttl", "5s", "--log-level", "info", "--lease", "")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--lease is required") {
		t.Errorf("empty --lease over BATON_LEASE: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestHelpDocumentsEnvAndExitCodes(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "is-leader", "leader"} {
		r := runApp(t.Context(), nil, cmd, "--help")
		if r.code != 0 {
			t.Fatalf("%s --help: exit %d: %s", cmd, r.code, r.stderr)
		}
		for _, w := range []string{"[$BATON_BACKEND]", "[$BATON_LEASE]", "[$BATON_TTL]", "A flag given on the\ncommand line wins over the environment", "Exit statuses"} {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%s --help does not mention %q:\n%s", cmd, w, r.stdout)
			}
		}
	}
}

func TestLeaderNoLeader(t *testing.T) {
	t.Parallel()
	r := runApp(t.Context(), nil, "leader", "--backend", "memory://", "--lease", "x", "--json")
	if r.code != exitFailure {
		t.Errorf("exit %d, want 1", r.code)
	}
	if got, want := r.stdout, `{"lease":"x","holder":null}`+"\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if !strings.Contains(r.stderr, `nobody holds lease "x"`) {
		t.Errorf("stderr %q", r.stderr)
	}
	r = runApp(t.Context(), nil, "leader", "--backend", "memory://", "--lease", "x")
	if r.code != exitFailure || r.stdout != "" {
		t.Errorf("text: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestIsLeaderMatchesHostWithoutID(t *testing.T) {
	t.Parallel()
	c := &isLeaderCommand{app: &App{Hostname: func() (string, error) { return "web-1", nil }}}
	match, err := c.matcher()
	if err != nil {
		t.Fatal(err)
	}
	for holder, want := range map[string]bool{"web-1/0a1b2c3d": true, "web-1": true, "web-2/0a1b2c3d": false, "web-1x/1": false} {
		if got := match(holder); got != want {
			t.Errorf("holder %q matched %v, want %v", holder, got, want)
		}
	}
	c.common.id = "web-1/0a1b2c3d"
	match, _ = c.matcher()
	if !match("web-1/0a1b2c3d") || match("web-1/ffffffff") {
		t.Error("with --id only that exact holder may match")
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]int{
		nil:                                     0,
		errors.New("x"):                         1,
		&exitError{code: 7}:                     7,
		fmt.Errorf("w: %w", &exitError{3, nil}): 3,
		&baton.ConfigError{Problems: []string{"p"}}: 2,
	} {
		if got := exitCode(err); got != want {
			t.Errorf("exitCode(%v) = %d, want %d", err, got, want)
		}
	}
}

func TestRunOncePassesExitStatusAndEnv(t *testing.T) {
	t.Parallel()
	r := runApp(t.Context(), nil, "run", "--backend", "memory://", "--lease", "x", "--id", "me", "--once", "--",
		"sh", "-c", `echo "$BATON_LEASE $BATON_TOKEN $BATON_HOLDER"; exit 7`)
	if r.code != 7 {
		t.Errorf("exit %d, want the command's 7; stderr:\n%s", r.code, r.stderr)
	}
	if r.stdout != "x 1 me\n" {
		t.Errorf("the command printed %q, want %q", r.stdout, "x 1 me\n")
	}
	r = runApp(t.Context(), nil, "run", "--backend", "memory://", "--lease", "x", "--once", "--", "true")
	if r.code != 0 {
		t.Errorf("--once with a successful command: exit %d; stderr:\n%s", r.code, r.stderr)
	}
}

// TestRunRestartsCommand checks that without --once a command that exits is
// run again (after the back-off), and that a stop request exits 0.
func TestRunRestartsCommand(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "runs")
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	done := make(chan result, 1)
	go func() {
		done <- runApp(ctx, nil, "run", "--backend", "memory://", "--lease", "x", "--",
			"sh", "-c", `echo "$BATON_TOKEN" >> "$0"`, file)
	}()
	testkit.Eventually(t, 20*time.Second, "the command to run twice", func() bool {
		b, _ := os.ReadFile(file)
		return strings.Count(string(b), "\n") >= 2
	})
	cancel(&signalError{syscall.SIGTERM})
	r := <-done
	if r.code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0; stderr:\n%s", r.code, r.stderr)
	}
	b, _ := os.ReadFile(file)
	if lines := strings.Fields(string(b)); len(lines) < 2 || lines[0] == lines[1] {
		t.Errorf("each run should have a new token: %q", lines)
	}
	if !strings.Contains(r.stderr, "waiting before campaigning again") {
		t.Errorf("a quickly exiting command should be restarted after a back-off; stderr:\n%s", r.stderr)
	}
}

// TestRunStopsCommandOnSignal checks that SIGTERM to baton stops the command
// with SIGTERM before baton exits 0.
func TestRunStopsCommandOnSignal(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "log")
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	done := make(chan result, 1)
	go func() {
		done <- runApp(ctx, nil, "run", "--backend", "memory://", "--lease", "x", "--grace", "5s", "--",
			"sh", "-c", `trap 'echo stopped >> "$0"; exit 0' TERM; echo started >> "$0"; while :; do sleep 0.05; done`, file)
	}()
	testkit.Eventually(t, 20*time.Second, "the command to start", func() bool {
		b, _ := os.ReadFile(file)
		return strings.Contains(string(b), "started")
	})
	cancel(&signalError{syscall.SIGINT})
	r := <-done
	if r.code != 0 {
		t.Errorf("exit %d, want 0; stderr:\n%s", r.code, r.stderr)
	}
	if b, _ := os.ReadFile(file); string(b) != "started\nstopped\n" {
		t.Errorf("the command should have been stopped with SIGTERM before baton exited; its log: %q", b)
	}
}

// raftMemberArgs makes a group CA and a member certificate with `baton tls`
// and returns the flags of a one-member raft:// group on a loopback port.
func raftMemberArgs(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	if r := runApp(t.Context(), nil, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: exit %d: %s", r.code, r.stderr)
	}
	if r := runApp(t.Context(), nil, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", "m1", "--host", "127.0.0.1"); r.code != 0 {
		t.Fatalf("tls cert: exit %d: %s", r.code, r.stderr)
	}
	return []string{"--backend", "raft://", "--bootstrap-expect", "1", "--voters", "1",
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "m1.pem"), "--tls-key", filepath.Join(dir, "m1-key.pem"),
		"--lease", "x"}
}

// TestRaftFlagsCheckedBeforeJoining: flags a raft member cannot use are
// usage errors (exit 2) found before the member starts, not runtime errors
// (exit 1) or errors found only once it joined a group.
func TestRaftFlagsCheckedBeforeJoining(t *testing.T) {
	t.Parallel()
	member := raftMemberArgs(t)
	env := map[string]string{"BATON_SECRET": "usage-test-secret-0123456789"}
	for _, tt := range []struct {
		name string
		args []string
		want []string
	}{
		{"bind port out of range", []string{"--bind", "127.0.0.1:99999"},
			[]string{`--bind "127.0.0.1:99999"`, `port "99999" is not a number from 0 to 65535`}},
		{"advertise port zero", []string{"--bind", "127.0.0.1:0", "--advertise", "127.0.0.1:0"},
			[]string{`--advertise "127.0.0.1:0"`, "from 1 to 65535"}},
		{"advertise the unspecified address", []string{"--bind", "127.0.0.1:0", "--advertise", "0.0.0.0:7390"},
			[]string{`--advertise "0.0.0.0:7390"`, "no address peers can dial"}},
		{"bind host with a stray %", []string{"--bind", "127.0.0.1%zz:7390"},
			[]string{`--bind "127.0.0.1%zz:7390"`, "contains '%'"}},
		{"witness cannot campaign", []string{"--bind", freePort(t), "--witness"},
			[]string{"--witness", "never campaigns", "baton agent --witness"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append(append([]string{"run"}, member...), tt.args...)
			r := runApp(t.Context(), env, append(args, "--", "true")...)
			if r.code != exitUsage {
				t.Errorf("exit %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
				}
			}
			if strings.Contains(r.stderr, "raft member started") {
				t.Errorf("the member started before the flags were checked:\n%s", r.stderr)
			}
		})
	}
}

// TestTLSValidForWritesNothing: a refused --valid-for leaves no file.
func TestTLSValidForWritesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runApp(t.Context(), nil, "tls", "ca", "--dir", dir, "--valid-for", "-1h")
	if r.code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("a refused tls ca wrote %v", entries)
	}
}

// TestVersion: `baton version` and `baton --version` print the same
// description of the build and exit 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	v := runApp(t.Context(), nil, "version")
	if v.code != 0 || !strings.HasPrefix(v.stdout, "baton ") || !strings.Contains(v.stdout, "commit: ") {
		t.Fatalf("version: exit %d, stdout %q, stderr %q", v.code, v.stdout, v.stderr)
	}
	f := runApp(t.Context(), nil, "--version")
	if f.code != 0 || f.stdout != v.stdout {
		t.Errorf("--version: exit %d, stdout %q; want version's %q", f.code, f.stdout, v.stdout)
	}
}

func TestVersionText(t *testing.T) {
	t.Parallel()
	settings := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	for _, tt := range []struct {
		name string
		bi   *debug.BuildInfo
		want []string
	}{
		{"release", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.2"},
			Settings: settings("vcs.revision", "0123abcd", "vcs.time", "2026-01-02T03:04:05Z", "vcs.modified", "false")},
			[]string{"baton v1.4.2\n", "commit: 0123abcd (2026-01-02T03:04:05Z)\n", "go: go1.26.0"}},
		{"dirty tree", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.4.3-0.20260102030405-0123abcd+dirty"},
			Settings: settings("vcs.revision", "0123abcd", "vcs.modified", "true")},
			[]string{"baton v1.4.3-0.20260102030405-0123abcd+dirty\n", "commit: 0123abcd, dirty: the tree had uncommitted changes"}},
		{"devel without VCS", &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
			[]string{"baton (devel): built from a source tree", "commit: unknown (built without version control information)"}},
	} {
		got := versionText(tt.bi, true)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tt.name, got, w)
			}
		}
		if tt.name != "dirty tree" && strings.Contains(got, "dirty") {
			t.Errorf("%s: %q says dirty", tt.name, got)
		}
	}
	if got := versionText(nil, false); !strings.Contains(got, "no build information") {
		t.Errorf("without build information: %q", got)
	}
}

// TestRunOnceAloneExitsWithoutWaitingToLeave: the only member of a group
// has nobody to hand raft leadership to and no group to leave, so `run
// --once` exits as soon as its command has, instead of waiting out the
// close timeout for a leader other than itself.
func TestRunOnceAloneExitsWithoutWaitingToLeave(t *testing.T) {
	t.Parallel()
	args := append(append([]string{"run", "--once", "--bind", freePort(t)}, raftMemberArgs(t)...), "--", "true")
	r := runApp(t.Context(), map[string]string{"BATON_SECRET": "usage-test-secret-0123456789"}, args...)
	if r.code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", r.code, r.stderr)
	}
	for _, bad := range []string{"leadership transfer failed", "could not leave the group", "did not finish"} {
		if strings.Contains(r.stderr, bad) {
			t.Errorf("the lone member tried to hand over or leave (%q):\n%s", bad, r.stderr)
		}
	}
	if !strings.Contains(r.stderr, "last member of the group") {
		t.Errorf("stderr does not say why the member did not leave:\n%s", r.stderr)
	}
}

// TestRunRefusesGarbageNodeID: a node-id file that is not an ID as baton
// writes it is a configuration error (exit 2) naming the file.
func TestRunRefusesGarbageNodeID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "node-id")
	if err := os.WriteFile(file, []byte("node 1\x00\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"run", "--once", "--bind", freePort(t), "--data-dir", dir}, raftMemberArgs(t)...), "--", "true")
	r := runApp(t.Context(), map[string]string{"BATON_SECRET": "usage-test-secret-0123456789"}, args...)
	if r.code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	for _, w := range []string{file, "letters, digits, '-', '_' and '.'"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
		}
	}
}

// silentServer accepts TCP connections on loopback and never answers: a
// hung server, or a port that some other program holds.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestQueryHonoursTimeout: against a server that accepts connections and
// never answers, is-leader gives up (exit 3) at --timeout: etcd with
// user:password@ (whose client authenticates before it returns, for up to
// its own 5 s dial timeout) and ZooKeeper (whose client waits up to 1 s for
// a close request to be answered). The bound is the point of --timeout, so
// it is asserted, with a margin below the overruns these had.
func TestQueryHonoursTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	const margin = 600 * time.Millisecond
	addr := silentServer(t)
	for _, backend := range []string{"etcd://user:secret@" + addr, "zk://" + addr + "/baton", "etcd://" + addr, "consul://" + addr} {
		t.Run(strings.SplitN(backend, ":", 2)[0], func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			r := runApp(t.Context(), nil, "is-leader", "--backend", backend, "--lease", "x", "--timeout", timeout.String())
			took := time.Since(start)
			if r.code != exitUndetermined {
				t.Errorf("exit %d, want %d; stderr:\n%s", r.code, exitUndetermined, r.stderr)
			}
			if took > timeout+margin {
				t.Errorf("is-leader --timeout %s took %s; stderr:\n%s", timeout, took.Round(time.Millisecond), r.stderr)
			}
			if strings.Contains(r.stderr, "secret") {
				t.Errorf("stderr shows the URL's password:\n%s", r.stderr)
			}
		})
	}
}

// TestEtcdWrongPassword: etcd refusing the URL's credentials is a
// configuration error (exit 2) that names the user, not an undetermined
// answer; the right ones work.
func TestEtcdWrongPassword(t *testing.T) {
	t.Parallel()
	e := testserver.StartEtcd(t)
	c := etcdClient(t, e.Endpoint())
	ctx := t.Context()
	if _, err := c.UserAdd(ctx, "root", "right-password"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	r := runApp(ctx, nil, "is-leader", "--backend", "etcd://root:wrong-password@"+e.Endpoint(), "--lease", "x")
	if r.code != exitUsage || !strings.Contains(r.stderr, `refused user "root"`) || !strings.Contains(r.stderr, "user:password@") {
		t.Errorf("wrong password: exit %d, want %d naming the user; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	if strings.Contains(r.stderr, "wrong-password") {
		t.Errorf("stderr shows the password:\n%s", r.stderr)
	}
	r = runApp(ctx, nil, "is-leader", "--backend", "etcd://root:right-password@"+e.Endpoint(), "--lease", "x")
	if r.code != exitFailure {
		t.Errorf("right password: exit %d, want %d (nobody leads); stderr:\n%s", r.code, exitFailure, r.stderr)
	}
}

// TestRunConsulSessionTTLBelowMinimum: when the Consul servers refuse the
// session TTL (TTL/2 below their session_ttl_min), `run` exits 2 with the
// fix instead of retrying a campaign that can never succeed.
func TestRunConsulSessionTTLBelowMinimum(t *testing.T) {
	t.Parallel()
	agent := testserver.StartConsul(t, testserver.ConsulOptions{})
	ttl := (3 * testserver.ConsulSessionTTLMin / 2).String() // session TTL 3/4 of the minimum
	r := runApp(t.Context(), nil, "run", "--backend", "consul://"+agent.Addr()+"/ux-ttl-min", "--lease", "x", "--ttl", ttl,
		"--timeout", "60s", "--once", "--", "true")
	if r.code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr:\n%s", r.code, exitUsage, r.stderr)
	}
	for _, w := range []string{"session_ttl_min", "set TTL to at least twice"} {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr does not mention %q:\n%s", w, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "campaign failed; retrying") {
		t.Errorf("the refused campaign was retried:\n%s", r.stderr)
	}
}
