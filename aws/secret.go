package aws

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/smithy-go"
	"github.com/batonhq/baton/backend/raft"
)

// A raft group's secret where secrets live on AWS: a Systems Manager
// Parameter Store parameter (a SecureString, read with decryption) or a
// Secrets Manager secret, read through the instance's role. A member reads
// it at start and again every raft.NodeOptions.ReloadEvery, so that a
// rotation reaches running members (docs/aws.md, "Rotation").

// Sentinel errors of the secret sources; errors wrap one of them, or the
// SDK's error for anything else (a network failure, throttling).
var (
	// ErrSecretAccessDenied reports that the role may not read the secret
	// (or decrypt it with its KMS key): AccessDeniedException and the like.
	ErrSecretAccessDenied = errors.New("aws: access denied to the secret")

	// ErrSecretNotFound reports that the parameter or secret does not
	// exist (in this region and account).
	ErrSecretNotFound = errors.New("aws: secret not found")

	// ErrSecretEmpty reports a parameter or secret whose value holds no
	// usable secret (raft.ParseSecrets's rules: one per line, each at
	// least raft.MinSecretLen bytes).
	ErrSecretEmpty = errors.New("aws: no usable secret in the value")
)

// SecretSource reads a group's secrets: the one a member proves first,
// and the others it also accepts during a rotation.
type SecretSource interface {
	// Secrets returns the secrets, the one to prove first first.
	Secrets(ctx context.Context) ([]string, error)
	// String names the source as the user gave it (ssm:NAME,
	// secretsmanager:NAME).
	String() string
}

// SSMAPI is the part of the Systems Manager client that SSMSecret uses;
// *ssm.Client implements it.
type SSMAPI interface {
	GetParameter(ctx context.Context, in *ssm.GetParameterInput, optFns ...func(*ssm.Options)) (*ssm.GetParameterOutput, error)
}

// SecretsManagerAPI is the part of the Secrets Manager client that
// SecretsManagerSecret uses; *secretsmanager.Client implements it.
type SecretsManagerAPI interface {
	ListSecretVersionIds(ctx context.Context, in *secretsmanager.ListSecretVersionIdsInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.ListSecretVersionIdsOutput, error)
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// SSMSecret reads the secrets from a Parameter Store parameter, with
// decryption (ssm:GetParameter, and kms:Decrypt on a customer-managed
// key). The value holds one secret per line, as raft.ParseSecrets reads
// them: during a rotation the old and the new, the one to prove first
// first. Safe for concurrent use.
type SSMSecret struct {
	API  SSMAPI
	Name string // the parameter's name (/baton/prod/secret) or ARN
}

// Secrets implements SecretSource.
func (s *SSMSecret) Secrets(ctx context.Context) ([]string, error) {
	out, err := s.API.GetParameter(ctx, &ssm.GetParameterInput{Name: sdkaws.String(s.Name), WithDecryption: sdkaws.Bool(true)})
	if err != nil {
		return nil, secretError(s.String(), "ssm:GetParameter", err)
	}
	if out.Parameter == nil || out.Parameter.Value == nil {
		return nil, fmt.Errorf("%s: %w: the parameter has no value", s, ErrSecretEmpty)
	}
	secret, previous, err := raft.ParseSecrets(*out.Parameter.Value)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", s, ErrSecretEmpty, err)
	}
	return append([]string{secret}, previous...), nil
}

func (s *SSMSecret) String() string { return "ssm:" + s.Name }

// Secrets Manager's staging labels that a member holds: the current
// version is proved first; a pending one (a rotation's first step) and the
// previous one (its second step) are accepted too.
const (
	stageCurrent  = "AWSCURRENT"
	stagePending  = "AWSPENDING"
	stagePrevious = "AWSPREVIOUS"
)

// SecretsManagerSecret reads the secrets from a Secrets Manager secret:
// the version labelled AWSCURRENT, proved first, and those labelled
// AWSPENDING and AWSPREVIOUS, accepted too, so that a rotation by stages
// (docs/aws.md, "Rotation") reaches every member without a restart. Each
// version's SecretString is read as raft.ParseSecrets reads a value. It
// lists the versions (secretsmanager:ListSecretVersionIds) at each call and
// fetches a version's value (secretsmanager:GetSecretValue) only the first
// time it sees it: a version's value never changes. Safe for concurrent
// use.
type SecretsManagerSecret struct {
	API SecretsManagerAPI
	ID  string // the secret's name or ARN

	mu     sync.Mutex
	values map[string][]string // by version ID
}

// Secrets implements SecretSource.
func (s *SecretsManagerSecret) Secrets(ctx context.Context) ([]string, error) {
	var current, pending, previous string
	in := &secretsmanager.ListSecretVersionIdsInput{SecretId: sdkaws.String(s.ID)}
	for p := secretsmanager.NewListSecretVersionIdsPaginator(s.API, in); p.HasMorePages(); {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, secretError(s.String(), "secretsmanager:ListSecretVersionIds", err)
		}
		for _, v := range page.Versions {
			if v.VersionId == nil {
				continue
			}
			for _, st := range v.VersionStages {
				switch st {
				case stageCurrent:
					current = *v.VersionId
				case stagePending:
					pending = *v.VersionId
				case stagePrevious:
					previous = *v.VersionId
				}
			}
		}
	}
	if current == "" {
		return nil, fmt.Errorf("%s: %w: no version is labelled %s", s, ErrSecretEmpty, stageCurrent)
	}
	var all []string
	for _, id := range []string{current, pending, previous} {
		if id == "" {
			continue
		}
		vals, err := s.version(ctx, id)
		if err != nil {
			return nil, err
		}
		for _, v := range vals {
			if !slices.Contains(all, v) {
				all = append(all, v)
			}
		}
	}
	s.forgetAllBut(current, pending, previous)
	return all, nil
}

// version returns the secrets of version id, fetched once.
func (s *SecretsManagerSecret) version(ctx context.Context, id string) ([]string, error) {
	s.mu.Lock()
	vals, ok := s.values[id]
	s.mu.Unlock()
	if ok {
		return vals, nil
	}
	out, err := s.API.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: sdkaws.String(s.ID), VersionId: sdkaws.String(id)})
	if err != nil {
		return nil, secretError(s.String(), "secretsmanager:GetSecretValue", err)
	}
	if out.SecretString == nil {
		return nil, fmt.Errorf("%s: %w: version %s has no SecretString (a binary secret?): store the secret as text", s, ErrSecretEmpty, id)
	}
	secret, others, err := raft.ParseSecrets(*out.SecretString)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: version %s: %w", s, ErrSecretEmpty, id, err)
	}
	vals = append([]string{secret}, others...)
	s.mu.Lock()
	if s.values == nil {
		s.values = map[string][]string{}
	}
	s.values[id] = vals
	s.mu.Unlock()
	return vals, nil
}

func (s *SecretsManagerSecret) forgetAllBut(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.values {
		if !slices.Contains(ids, id) {
			delete(s.values, id)
		}
	}
}

func (s *SecretsManagerSecret) String() string { return "secretsmanager:" + s.ID }

// secretError sorts an SDK error of action on source into the sentinels,
// with a hint at the fix.
func secretError(source, action string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "AccessDeniedException", "AccessDenied", "UnrecognizedClientException", "InvalidSignatureException",
			"ExpiredTokenException", "DecryptionFailure", "KMSAccessDeniedException":
			return fmt.Errorf("%s: %w: %s: give the instance's role %s on it (and kms:Decrypt on its key, if it is a customer-managed one): %w",
				source, ErrSecretAccessDenied, ae.ErrorCode(), action, err)
		case "ParameterNotFound", "ParameterVersionNotFound", "ResourceNotFoundException":
			return fmt.Errorf("%s: %w: create it, or check its name and the region (AWS_REGION, else this instance's): %w", source, ErrSecretNotFound, err)
		}
	}
	return fmt.Errorf("%s: %s: %w", source, action, err)
}

// ParseSecretSource reads a --secret-from value: ssm:NAME (a Parameter
// Store parameter's name or ARN) or secretsmanager:NAME (a secret's name
// or ARN). It returns the scheme and the name; the caller builds the
// source with its clients.
func ParseSecretSource(spec string) (scheme, name string, err error) {
	scheme, name, ok := strings.Cut(spec, ":")
	switch {
	case !ok || name == "":
		return "", "", fmt.Errorf("want ssm:PARAMETER (e.g. ssm:/baton/prod/secret) or secretsmanager:NAME (e.g. secretsmanager:baton/prod)")
	case scheme == "ssm", scheme == "secretsmanager":
		return scheme, name, nil
	case strings.EqualFold(scheme, "ssm"), strings.EqualFold(scheme, "secretsmanager"), strings.EqualFold(scheme, "secrets-manager"), strings.EqualFold(scheme, "sm"):
		want := "ssm"
		if !strings.EqualFold(scheme, "ssm") {
			want = "secretsmanager"
		}
		return "", "", fmt.Errorf("unknown source %q: did you mean %s:%s?", scheme, want, name)
	}
	return "", "", fmt.Errorf("unknown source %q: want ssm:PARAMETER or secretsmanager:NAME", scheme)
}
