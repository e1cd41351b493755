package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
)

// The group's secret from Parameter Store and Secrets Manager: real baton
// processes, whose SDK clients (the default credential chain, here static
// keys in the environment) talk to internal/awsfake over the services'
// JSON protocol.

// TestSecretFromAWS: a member reads its secret from a SecureString
// parameter and from a Secrets Manager secret, and picks up a staged
// rotation of the secret without a restart; a parameter that does not
// exist, or that the role may not read, stops it with exit 2 and the
// reason.
func TestSecretFromAWS(t *testing.T) {
	t.Parallel()
	const secret1, secret2 = "aws-secret-one-0123456789abcdef", "aws-secret-two-0123456789abcdef"
	f := awsfake.Start(t)
	f.PutParameter("/baton/prod/secret", secret1, true)
	f.PutParameter("/baton/denied", secret1, true)
	f.DenySecret("ssm:/baton/denied")
	f.PutSecretValue("baton/prod", secret1)
	env := awsEnv(t, f, "http://"+closedPort(t), "AWS_REGION=us-east-1")
	member := func(source string, extra ...string) []string {
		return append([]string{"run", "--backend", "raft://", "--bind", "127.0.0.1:0", "--bootstrap-expect", "1", "--voters", "1",
			"--lease", "aws-secret", "--secret-from", source}, extra...)
	}

	for _, c := range []struct {
		source string
		want   []string
	}{
		{"ssm:/baton/nope", []string{"not found", "create it"}},
		{"ssm:/baton/denied", []string{"access denied", "AccessDeniedException", "ssm:GetParameter"}},
		{"secretsmanager:baton/nope", []string{"not found"}},
	} {
		p := startBaton(t, c.source, env, append(member(c.source), "--", "true")...)
		code := p.wait(t, 60*time.Second)
		if code != exitUsage || !strings.Contains(p.out.String(), c.source) {
			t.Fatalf("--secret-from %s: exit %d, want %d naming the source; output:\n%s", c.source, code, exitUsage, p.out)
		}
		for _, w := range c.want {
			if !strings.Contains(p.out.String(), w) {
				t.Errorf("--secret-from %s: output lacks %q:\n%s", c.source, w, p.out)
			}
		}
	}

	dir := t.TempDir()
	for _, source := range []string{"ssm:/baton/prod/secret", "secretsmanager:baton/prod"} {
		mark := filepath.Join(dir, strings.NewReplacer(":", "-", "/", "-").Replace(source))
		p := startBaton(t, source, env, append(member(source, "--reload-every", "200ms"), "--", "sh", "-c", "touch "+mark+"; exec sleep 600")...)
		testkit.Eventually(t, 60*time.Second, source+": the command run by the one-member group", func() bool {
			_, err := os.Stat(mark)
			return err == nil
		})
		if !strings.HasPrefix(source, "secretsmanager:") {
			continue
		}
		// A rotation by stages, picked up while the member runs.
		id2 := f.PutSecretValue("baton/prod", secret2, "AWSPENDING")
		testkit.Eventually(t, 30*time.Second, "the pending version picked up", func() bool {
			return strings.Contains(p.out.String(), "the group's secrets changed") && strings.Contains(p.out.String(), "held=2")
		})
		f.UpdateSecretVersionStage("baton/prod", "AWSCURRENT", id2)
		f.UpdateSecretVersionStage("baton/prod", "AWSPENDING", "")
		f.UpdateSecretVersionStage("baton/prod", "AWSPREVIOUS", "")
		testkit.Eventually(t, 30*time.Second, "the retirement of the old version picked up", func() bool {
			return strings.Contains(p.out.String(), "held=1")
		})
	}
}
