package main

import (
	"strings"
	"testing"
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
