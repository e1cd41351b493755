package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/pflag"
)

// FuzzBackendFlag: any --backend value gets, from the common flags'
// validation, problems or a backend, never a panic and never both; an
// aws-asg:// URL is accepted only by the commands that take the group's
// rule, and only with a group name Auto Scaling could have.
func FuzzBackendFlag(f *testing.F) {
	for _, seed := range []string{
		"aws-asg://", "aws-asg://web", "AWS-ASG://web", "aws-asg://my%20group", "aws-asg://we%zz",
		"aws-asg:///web", "aws-asg://web?region=x", "aws-asg://a@web", "aws-asg://web#x", "aws-asg://\x00",
		"aws-asg://" + strings.Repeat("g", 256), "aws-asg:/web", "aws-asg:web", "aws-asg://%ff",
		"etcd://127.0.0.1:2379", "memory://", "raft://", "zk://h:2181/x", "consul://h", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		for _, rule := range []bool{true, false} {
			c := &commonFlags{rule: rule}
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			c.register(fs, "id")
			c.backend, c.lease = raw, "x"
			problems, spec := c.validate()
			if len(problems) > 0 && (spec != nil || c.isRule) {
				t.Fatalf("%q (rule %v): problems %q and yet a backend", raw, rule, problems)
			}
			for _, p := range problems {
				if strings.TrimSpace(p) == "" {
					t.Fatalf("%q: an empty problem", raw)
				}
			}
			if !isRuleURL(raw) {
				if c.isRule {
					t.Fatalf("%q is not aws-asg:// but was taken as the rule", raw)
				}
				continue
			}
			if !rule && (len(problems) == 0 || !strings.Contains(problems[0], "raft:// --join aws-asg")) {
				t.Fatalf("%q accepted by a command that needs a lease: %q", raw, problems)
			}
			if c.isRule {
				g := c.ruleGroup
				if len(g) > 255 || !utf8.ValidString(g) || strings.IndexFunc(g, unicode.IsControl) >= 0 || strings.HasPrefix(g, "/") {
					t.Fatalf("%q accepted with group %q, which Auto Scaling cannot name", raw, g)
				}
			}
		}
	})
}

// TestAWSJoinWiresTheGroup: --join aws-asg gives the raft member the
// group's departures, and --bootstrap-expect auto its count; other joins
// give neither.
func TestAWSJoinWiresTheGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", "m1", "--host", "127.0.0.1"); r.code != 0 {
		t.Fatalf("tls cert: %d %s", r.code, r.stderr)
	}
	for _, tc := range []struct {
		join, expect       string
		departures, counts bool
		n                  int
	}{
		{"aws-asg", "auto", true, true, 0},
		{"aws-asg:web", "3", true, false, 3},
		{"static:127.0.0.1:7390", "1", false, false, 1},
	} {
		r := &raftFlags{}
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		r.register(fs)
		args := []string{"--bind", "127.0.0.1:7390", "--join", tc.join, "--bootstrap-expect", tc.expect, "--secret", "0123456789abcdef0123",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "m1.pem"), "--tls-key", filepath.Join(dir, "m1-key.pem")}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if p := r.validate(); len(p) > 0 {
			t.Fatalf("%s: %q", tc.join, p)
		}
		opts, err := r.nodeOptions(context.Background(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("%s: %v", tc.join, err)
		}
		if (opts.Departures != nil) != tc.departures || (opts.ExpectCounter != nil) != tc.counts || opts.BootstrapExpect != tc.n {
			t.Errorf("--join %s --bootstrap-expect %s: departures %v, expect counter %v, bootstrap-expect %d; want %v, %v, %d",
				tc.join, tc.expect, opts.Departures != nil, opts.ExpectCounter != nil, opts.BootstrapExpect, tc.departures, tc.counts, tc.n)
		}
	}
}
