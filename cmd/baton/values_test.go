package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/etcd"
	"github.com/spf13/pflag"
)

// Values and mistakes that baton refuses with exit 2 and a message saying
// what is wrong and what to change, none of which starts anything: a raft
// TTL below the floor its timing can honour (raft://, agent:// and demo;
// the floor, 2.21s at raft's default heartbeat timeout, and why), a
// --grace too long for the TTL actually in force (the backend's default
// when --ttl is not given, never "--ttl 10s" on raft or Consul), a
// mistyped backend URL with a suggestion that is what was meant, and a
// command given without -- before it.
func TestValuesAndMistakes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
		not  []string
	}{
		{"raft ttl 100ms", nil,
			[]string{"run", "--backend", "raft://", "--lease", "x", "--ttl", "100ms", "--", "true"},
			[]string{"--ttl 100ms: below 2.21s, the shortest TTL the embedded raft group can honour", "heartbeat timeout (1.25s)", "use --ttl 2.21s or more", "default is 5s"}, nil},
		{"raft ttl 500ms", nil,
			[]string{"cron", "--schedule", "@daily", "--backend", "raft://", "--lease", "x", "--ttl", "500ms", "--", "true"},
			[]string{"--ttl 500ms: below 2.21s", "renewal window", "283ms here"}, nil},
		{"raft ttl 2.2s from the environment", map[string]string{"BATON_TTL": "2.2s"},
			[]string{"run", "--backend", "raft://", "--lease", "x", "--", "true"},
			[]string{"BATON_TTL 2.2s: below 2.21s"}, nil},
		{"agent ttl 1s", nil,
			[]string{"run", "--backend", "agent://127.0.0.1:8790", "--lease", "x", "--ttl", "1s", "--", "true"},
			[]string{"--ttl 1s: below 2.21s"}, nil},
		{"demo ttl 1s", nil,
			[]string{"demo", "--ttl", "1s"},
			[]string{"--ttl 1s: below 2.21s"}, nil},
		{"grace on raft at its default ttl", nil,
			[]string{"run", "--backend", "raft://", "--lease", "x", "--grace", "5s", "--", "true"},
			[]string{"--grace 5s: must be below 2.833s (the renewal window at the default TTL of raft://, 5s"}, []string{"10s"}},
		{"grace on agent at its default ttl", nil,
			[]string{"run", "--backend", "agent://127.0.0.1:8790", "--lease", "x", "--grace", "5s", "--", "true"},
			[]string{"the renewal window at the default TTL of agent://, 5s"}, []string{"10s"}},
		{"grace on consul at its default ttl", nil,
			[]string{"run", "--backend", "consul://127.0.0.1:8500", "--lease", "x", "--grace", "5s", "--", "true"},
			[]string{"the renewal window at the default TTL of consul://, 20s"}, []string{"10s"}},
		{"grace on etcd at its default ttl", nil,
			[]string{"cron", "--schedule", "@daily", "--backend", "etcd://127.0.0.1:2379", "--lease", "x", "--grace", "5s", "--", "true"},
			[]string{"must be below 4s (the renewal window at the default TTL of etcd://, 10s"}, nil},
		{"grace at a given ttl", nil,
			[]string{"run", "--backend", "raft://", "--lease", "x", "--ttl", "3s", "--grace", "2s", "--", "true"},
			[]string{"the renewal window at --ttl 3s"}, nil},
		{"url without slashes", nil,
			[]string{"run", "--backend", "raft:/", "--lease", "x", "--", "true"},
			[]string{"did you mean raft://?"}, []string{"etcd://raft"}},
		{"misspelt scheme", nil,
			[]string{"is-leader", "--backend", "etdc://10.0.0.5:2379", "--lease", "x"},
			[]string{`unknown backend scheme "etdc" (did you mean etcd://10.0.0.5:2379?)`}, nil},
		{"zookeeper for zk", nil,
			[]string{"is-leader", "--backend", "zookeeper://h:2181/svc", "--lease", "x"},
			[]string{"did you mean zk://h:2181/svc?"}, nil},
		{"kubernetes for k8s", nil,
			[]string{"is-leader", "--backend", "kubernetes://default", "--lease", "x"},
			[]string{"did you mean k8s://default?"}, nil},
		{"no suggestion for another scheme", nil,
			[]string{"is-leader", "--backend", "mysql://db/x", "--lease", "x"},
			[]string{`unknown backend scheme "mysql"`, "supported are"}, []string{"did you mean"}},
		{"command without --", nil,
			[]string{"run", "--backend", "memory://", "--lease", "x", "sh", "-c", "echo hi"},
			[]string{"unknown shorthand flag: 'c' in -c", "belongs to the command to run (sh)", "put -- before the command", "baton run [flags] -- sh"}, nil},
		{"cron command without --", nil,
			[]string{"cron", "--schedule", "@daily", "--backend", "memory://", "--lease", "x", "ls", "--all"},
			[]string{"unknown flag: --all", "put -- before the command", "baton cron [flags] -- ls"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runApp(t.Context(), tc.env, tc.args...)
			checkUsageError(t, r, tc.want)
			for _, n := range tc.not {
				if strings.Contains(r.stderr, n) {
					t.Errorf("stderr mentions %q:\n%s", n, r.stderr)
				}
			}
		})
	}
	// A flag of baton's own that is unknown is not taken for the command's.
	r := runApp(t.Context(), nil, "run", "--backend", "memory://", "--lease", "x", "--bogus", "--", "true")
	checkUsageError(t, r, []string{"unknown flag: --bogus"})
	if strings.Contains(r.stderr, "put --") {
		t.Errorf("an unknown flag before the command is explained as a missing --:\n%s", r.stderr)
	}
}

// A server's refusal of the TTL when --ttl was not given names the
// backend's own default, the TTL that was in force.
func TestNamingTTLNamesTheDefaultInForce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ backend, want string }{
		{"consul://127.0.0.1:8500", "--ttl unset (the default TTL of consul://, 20s)"},
		{"zk://127.0.0.1:2181", "--ttl unset (the default TTL of zk://, 10s)"},
	} {
		var c commonFlags
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		c.register(fs, "id")
		if err := fs.Parse([]string{"--backend", tc.backend}); err != nil {
			t.Fatal(err)
		}
		err := namingTTL(fs, &etcd.TTLError{TTL: 10 * time.Second, Err: errors.New("refused")})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want it to say %q", tc.backend, err, tc.want)
		}
	}
}
