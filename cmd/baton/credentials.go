package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/batonhq/baton/aws"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/internal/certs"
)

// credentials are a raft member's secrets and TLS files as its flags name
// them: read at start, and again every --reload-every by the member
// (raft.Reloader), so that a rotation of the secret (--secret-file,
// --secret-from) or of the certificates (--tls-*) needs no restart.
// Safe for concurrent use.
type credentials struct {
	secret string           // --secret, BATON_SECRET
	file   string           // --secret-file
	source aws.SecretSource // --secret-from
	tls    certs.Files      // CA mode; zero in the secret-only mode

	mu       sync.Mutex
	tlsStamp [sha256.Size]byte // of the TLS files' contents last loaded
}

var _ raft.Reloader = (*credentials)(nil)

// caMode reports whether any --tls-* flag is set: CA mode (validate
// checks that all three are).
func (r *raftFlags) caMode() bool { return r.tlsCA != "" || r.tlsCert != "" || r.tlsKey != "" }

// newCredentials builds the member's credentials from the flags; with
// --secret-from, the AWS clients from the SDK's default configuration
// (the instance's role).
func (r *raftFlags) newCredentials(ctx context.Context) (*credentials, error) {
	c := &credentials{secret: r.secret, file: r.secretFile}
	if r.caMode() {
		c.tls = certs.Files{CA: r.tlsCA, Cert: r.tlsCert, Key: r.tlsKey}
	}
	if r.secretFrom != "" {
		scheme, name, err := aws.ParseSecretSource(r.secretFrom)
		if err != nil {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("--secret-from %q: %w", r.secretFrom, err)}
		}
		cfg, err := awsConfig(ctx)
		if err != nil {
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("--secret-from %s: %w", r.secretFrom, err)}
		}
		switch scheme {
		case "ssm":
			c.source = &aws.SSMSecret{API: ssm.NewFromConfig(cfg), Name: name}
		case "secretsmanager":
			c.source = &aws.SecretsManagerSecret{API: secretsmanager.NewFromConfig(cfg), ID: name}
		}
	}
	return c, nil
}

// reloads reports whether anything of c can change while the member runs
// (an environment variable cannot).
func (c *credentials) reloads() bool {
	return c.file != "" || c.source != nil || c.tls != (certs.Files{})
}

// Reload implements raft.Reloader.
func (c *credentials) Reload(ctx context.Context) ([]string, *tls.Config, error) {
	return c.load(ctx, false)
}

// load reads the secrets and, in CA mode, the TLS files: at start (first),
// always; later, a TLS configuration only when the files changed. A
// problem the user must fix is an *exitError with exitUsage.
func (c *credentials) load(ctx context.Context, first bool) ([]string, *tls.Config, error) {
	secrets, err := c.secrets(ctx)
	if err != nil {
		return nil, nil, err
	}
	if c.tls == (certs.Files{}) {
		return secrets, nil, nil
	}
	stamp, err := c.tlsFilesStamp()
	if err != nil {
		return nil, nil, &exitError{code: exitUsage, err: err}
	}
	c.mu.Lock()
	unchanged := !first && bytes.Equal(stamp[:], c.tlsStamp[:])
	c.mu.Unlock()
	if unchanged {
		return secrets, nil, nil
	}
	cfg, err := certs.Load(c.tls)
	if err != nil {
		return nil, nil, &exitError{code: exitUsage, err: err}
	}
	c.mu.Lock()
	c.tlsStamp = stamp
	c.mu.Unlock()
	return secrets, cfg, nil
}

// secrets reads the secrets from where the flags say.
func (c *credentials) secrets(ctx context.Context) ([]string, error) {
	switch {
	case c.source != nil:
		s, err := c.source.Secrets(ctx)
		if err != nil {
			code := exitFailure
			if errors.Is(err, aws.ErrSecretAccessDenied) || errors.Is(err, aws.ErrSecretNotFound) || errors.Is(err, aws.ErrSecretEmpty) {
				code = exitUsage
			}
			return nil, &exitError{code: code, err: fmt.Errorf("--secret-from %w", err)}
		}
		return s, nil
	case c.file != "":
		secret, previous, err := raft.ReadSecretFile(c.file)
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				return nil, &exitError{code: exitUsage, err: fmt.Errorf("--secret-file: %w", err)}
			}
			return nil, &exitError{code: exitUsage, err: fmt.Errorf("--secret-file %w", err)}
		}
		return append([]string{secret}, previous...), nil
	}
	secret, previous, err := raft.ParseSecrets(c.secret)
	if err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("BATON_SECRET (--secret): %w", err)}
	}
	return append([]string{secret}, previous...), nil
}

// tlsFilesStamp digests the TLS files' contents, so that a reload builds a
// new configuration only when one of them changed.
func (c *credentials) tlsFilesStamp() ([sha256.Size]byte, error) {
	h := sha256.New()
	for _, f := range []string{c.tls.CA, c.tls.Cert, c.tls.Key} {
		b, err := os.ReadFile(f)
		if err != nil {
			return [sha256.Size]byte{}, fmt.Errorf("reading the TLS files: %w", err)
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out, nil
}
