package aws

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/batonhq/baton/internal/awsfake"
)

// The secret sources run the real SDK clients against internal/awsfake,
// which speaks the services' JSON protocol.

func fakeSecretClients(f *awsfake.Server) (*ssm.Client, *secretsmanager.Client) {
	cfg := sdkaws.Config{Region: "us-east-1", Credentials: testCredentials, BaseEndpoint: sdkaws.String(f.URL())}
	return ssm.NewFromConfig(cfg), secretsmanager.NewFromConfig(cfg)
}

const (
	oldSecret = "old-secret-0123456789abcdef"
	newSecret = "new-secret-0123456789abcdef"
)

func secretsOf(t *testing.T, s SecretSource) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := s.Secrets(ctx)
	if err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return got
}

func TestSSMSecret(t *testing.T) {
	f := awsfake.Start(t)
	ssmc, _ := fakeSecretClients(f)
	src := &SSMSecret{API: ssmc, Name: "/baton/prod/secret"}
	f.PutParameter("/baton/prod/secret", oldSecret+"\n", true)
	if got := secretsOf(t, src); !slices.Equal(got, []string{oldSecret}) {
		t.Fatalf("secrets %q, want the decrypted value %q", got, oldSecret)
	}
	// A rotation's step: the new secret accepted beside the old.
	f.PutParameter("/baton/prod/secret", oldSecret+"\n"+newSecret+"\n", true)
	if got := secretsOf(t, src); !slices.Equal(got, []string{oldSecret, newSecret}) {
		t.Fatalf("secrets %q, want both, the old first", got)
	}
	f.PutParameter("/baton/prod/secret", "short", true)
	ctx := context.Background()
	if _, err := src.Secrets(ctx); !errors.Is(err, ErrSecretEmpty) || !strings.Contains(err.Error(), "at least 16") {
		t.Fatalf("a short secret: %v, want ErrSecretEmpty naming the minimum", err)
	}
	missing := &SSMSecret{API: ssmc, Name: "/baton/nope"}
	if _, err := missing.Secrets(ctx); !errors.Is(err, ErrSecretNotFound) || !strings.Contains(err.Error(), "ssm:/baton/nope") {
		t.Fatalf("a missing parameter: %v, want ErrSecretNotFound naming it", err)
	}
	f.PutParameter("/baton/denied", oldSecret, true)
	f.DenySecret("ssm:/baton/denied")
	denied := &SSMSecret{API: ssmc, Name: "/baton/denied"}
	if _, err := denied.Secrets(ctx); !errors.Is(err, ErrSecretAccessDenied) || !strings.Contains(err.Error(), "ssm:GetParameter") {
		t.Fatalf("a denied parameter: %v, want ErrSecretAccessDenied naming ssm:GetParameter", err)
	}
}

func TestSecretsManagerSecretStages(t *testing.T) {
	f := awsfake.Start(t)
	_, smc := fakeSecretClients(f)
	src := &SecretsManagerSecret{API: smc, ID: "baton/prod"}
	oldID := f.PutSecretValue("baton/prod", oldSecret)
	if got := secretsOf(t, src); !slices.Equal(got, []string{oldSecret}) {
		t.Fatalf("secrets %q, want [old]", got)
	}
	// Step 1: the new version pending: accepted, the current one proved.
	newID := f.PutSecretValue("baton/prod", newSecret, "AWSPENDING")
	if got := secretsOf(t, src); !slices.Equal(got, []string{oldSecret, newSecret}) {
		t.Fatalf("with a pending version: %q, want [old new]", got)
	}
	// Step 2: the new version current; the old one previous.
	f.UpdateSecretVersionStage("baton/prod", "AWSCURRENT", newID)
	f.UpdateSecretVersionStage("baton/prod", "AWSPENDING", "")
	if got := secretsOf(t, src); !slices.Equal(got, []string{newSecret, oldSecret}) {
		t.Fatalf("after AWSCURRENT moved: %q, want [new old]", got)
	}
	// Step 3: AWSPREVIOUS removed: the old secret retired.
	f.UpdateSecretVersionStage("baton/prod", "AWSPREVIOUS", "")
	if got := secretsOf(t, src); !slices.Equal(got, []string{newSecret}) {
		t.Fatalf("after AWSPREVIOUS was removed: %q, want [new]", got)
	}
	// Each version's value was fetched once.
	var reads []string
	for _, r := range f.SecretReads() {
		reads = append(reads, strings.TrimPrefix(r, "secretsmanager:baton/prod#"))
	}
	if !slices.Equal(reads, []string{oldID, newID}) {
		t.Fatalf("values read %q, want each version once: %q", reads, []string{oldID, newID})
	}

	ctx := context.Background()
	if _, err := (&SecretsManagerSecret{API: smc, ID: "baton/nope"}).Secrets(ctx); !errors.Is(err, ErrSecretNotFound) {
		t.Fatalf("a missing secret: %v, want ErrSecretNotFound", err)
	}
	f.PutSecretValue("baton/denied", oldSecret)
	f.DenySecret("secretsmanager:baton/denied")
	if _, err := (&SecretsManagerSecret{API: smc, ID: "baton/denied"}).Secrets(ctx); !errors.Is(err, ErrSecretAccessDenied) || !strings.Contains(err.Error(), "secretsmanager:ListSecretVersionIds") {
		t.Fatalf("a denied secret: %v, want ErrSecretAccessDenied naming the action", err)
	}
}

func TestParseSecretSource(t *testing.T) {
	for _, c := range []struct{ spec, scheme, name, err string }{
		{"ssm:/baton/prod/secret", "ssm", "/baton/prod/secret", ""},
		{"ssm:arn:aws:ssm:us-east-1:123456789012:parameter/baton", "ssm", "arn:aws:ssm:us-east-1:123456789012:parameter/baton", ""},
		{"secretsmanager:baton/prod", "secretsmanager", "baton/prod", ""},
		{"SSM:/x", "", "", "did you mean ssm:/x"},
		{"secrets-manager:x", "", "", "did you mean secretsmanager:x"},
		{"vault:x", "", "", "unknown source"},
		{"/baton/secret", "", "", "want ssm:PARAMETER"},
		{"ssm:", "", "", "want ssm:PARAMETER"},
	} {
		scheme, name, err := ParseSecretSource(c.spec)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want an error saying %q", c.spec, err, c.err)
			}
			continue
		}
		if err != nil || scheme != c.scheme || name != c.name {
			t.Errorf("%q: %q %q %v, want %q %q", c.spec, scheme, name, err, c.scheme, c.name)
		}
	}
}
