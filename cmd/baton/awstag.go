package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// tagScheme is the --backend scheme of is-leader for agentless groups:
// this instance's own tag, as baton-lambda (or `baton run --aws-tag`)
// writes it, read through IMDSv2's instance-metadata tags. It holds no
// lease and gives no safe-until.
const tagScheme = "aws-tag"

// tagForm is the URL form, for messages and help.
const tagForm = "aws-tag://KEY[=VALUE] (KEY %-escaped where it holds / ? # or %; default VALUE: any)"

// isTagURL reports whether raw names the aws-tag:// scheme.
func isTagURL(raw string) bool {
	scheme, _, ok := strings.Cut(raw, "://")
	return ok && strings.EqualFold(scheme, tagScheme)
}

// parseTagURL returns the tag key and the value it must have ("" for
// any) of an aws-tag://KEY[=VALUE] URL.
func parseTagURL(raw string) (key, value string, err error) {
	_, rest, _ := strings.Cut(raw, "://")
	if strings.ContainsAny(rest, "?#/") {
		return "", "", fmt.Errorf("aws-tag:// takes a tag key and an optional =VALUE, nothing else: use %s", tagForm)
	}
	k, v, _ := strings.Cut(rest, "=")
	if key, err = url.PathUnescape(k); err != nil {
		return "", "", fmt.Errorf("tag key %q: %v: use %s", k, err, tagForm)
	}
	if value, err = url.PathUnescape(v); err != nil {
		return "", "", fmt.Errorf("tag value %q: %v: use %s", v, err, tagForm)
	}
	if key == "" || len(key) > 127 || strings.HasPrefix(strings.ToLower(key), "aws:") {
		return "", "", fmt.Errorf("tag key %q: want 1 to 127 characters, not starting with aws: (e.g. aws-tag://app:isLeader)", key)
	}
	return key, value, nil
}

// tagIsLeader answers is-leader from this instance's own tag: 0 when the
// tag is present (with VALUE, if the URL names one), 1 when it is absent or
// has another value, 2 for a bad URL, 3 when the metadata service cannot
// be read (tags in instance metadata off, IMDSv2 unreachable).
func (c *isLeaderCommand) tagIsLeader(ctx context.Context) error {
	key, want, err := parseTagURL(c.common.backend)
	if err != nil {
		return usageErrorf("%s %q: %v", flagSource(c.common.fs, "backend"), c.common.backend, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	m, err := newOwnMetadata(ctx)
	if err != nil {
		return err
	}
	b, found, err := m.tag(ctx, key)
	if err != nil {
		return err
	}
	if !found {
		if c.verbose {
			fmt.Fprintf(c.app.stdout(), "not leader: no tag %s on this instance\n", key)
		}
		return &exitError{code: exitFailure}
	}
	if want != "" && string(b) != want {
		if c.verbose {
			fmt.Fprintf(c.app.stdout(), "not leader: tag %s=%s on this instance, want %s\n", key, b, want)
		}
		return &exitError{code: exitFailure}
	}
	if c.verbose {
		fmt.Fprintf(c.app.stdout(), "leader: tag %s=%s on this instance\n", key, b)
	}
	return nil
}

// ownMetadata reads this instance's own metadata through IMDSv2.
type ownMetadata struct {
	client *imds.Client
}

// newOwnMetadata returns a reader of this instance's metadata; an error
// is a configuration error (exit 2).
func newOwnMetadata(ctx context.Context) (*ownMetadata, error) {
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"))
	if err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("loading the AWS configuration: %w", err)}
	}
	return &ownMetadata{client: imds.NewFromConfig(cfg, func(o *imds.Options) { o.EnableFallback = sdkaws.FalseTernary })}, nil
}

// read returns the metadata at path; found is false for a 404. Any other
// failure is an exit-3 error: the metadata could not be read.
func (m *ownMetadata) read(ctx context.Context, path string) (value string, found bool, err error) {
	start := time.Now()
	out, err := m.client.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == 404 {
			return "", false, nil
		}
		return "", false, &exitError{code: exitUndetermined, err: fmt.Errorf("baton: reading %s from the instance metadata (IMDSv2) failed after %s: %w", path, time.Since(start).Round(time.Millisecond), err)}
	}
	defer out.Content.Close()
	b, err := io.ReadAll(out.Content)
	if err != nil {
		return "", false, &exitError{code: exitUndetermined, err: fmt.Errorf("baton: reading %s from the instance metadata: %w", path, err)}
	}
	return string(b), true, nil
}

// tag returns this instance's tag key; found is false when the instance
// has no such tag. Tags in metadata turned off is an exit-3 error, never
// "no tag": the tags path itself is then 404 too.
func (m *ownMetadata) tag(ctx context.Context, key string) (value string, found bool, err error) {
	value, found, err = m.read(ctx, "tags/instance/"+key)
	if err != nil || found {
		return value, found, err
	}
	if _, listed, lerr := m.read(ctx, "tags/instance"); lerr != nil || !listed {
		if lerr == nil {
			lerr = errors.New("tags/instance: 404 Not Found")
		}
		return "", false, &exitError{code: exitUndetermined, err: fmt.Errorf("baton: the instance's tags are not in its metadata (turn on InstanceMetadataTags in the launch template): %w", lerr)}
	}
	return "", false, nil
}

// tagLeaderJSON is leader's --json document with aws-tag://. Holder is
// this instance when it is tagged, null otherwise: the metadata of one
// instance cannot name another.
type tagLeaderJSON struct {
	Backend    string  `json:"backend"`
	Tag        string  `json:"tag"`
	InstanceID string  `json:"instance_id"`
	Holder     *string `json:"holder"`
	Value      *string `json:"value,omitempty"`
	Token      string  `json:"token,omitempty"`
}

// tagLeader answers leader from this instance's own tags: the holder is
// this instance when it carries the tag (with VALUE, if the URL names
// one), with the token tag KEY-token when present; otherwise exit 1,
// saying that the leader, if any, is another instance that this
// instance's metadata cannot name.
func (c *leaderCommand) tagLeader(ctx context.Context) error {
	key, want, err := parseTagURL(c.common.backend)
	if err != nil {
		return usageErrorf("%s %q: %v", flagSource(c.common.fs, "backend"), c.common.backend, err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	m, err := newOwnMetadata(ctx)
	if err != nil {
		return err
	}
	self, found, err := m.read(ctx, "instance-id")
	if err == nil && !found {
		err = &exitError{code: exitUndetermined, err: errors.New("baton: the instance metadata has no instance-id (404)")}
	}
	if err != nil {
		return err
	}
	value, tagged, err := m.tag(ctx, key)
	if err != nil {
		return err
	}
	var token string
	if tagged && (want == "" || value == want) {
		if token, _, err = m.tag(ctx, key+"-token"); err != nil {
			return err
		}
	}
	doc := tagLeaderJSON{Backend: tagScheme, Tag: key, InstanceID: self, Token: token}
	if tagged {
		doc.Value = &value
	}
	leads := tagged && (want == "" || value == want)
	if leads {
		doc.Holder = &self
	}
	out := c.app.stdout()
	if c.json {
		b, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s\n", b)
	}
	if !leads {
		why := fmt.Sprintf("this instance (%s) has no tag %s", self, key)
		if tagged {
			why = fmt.Sprintf("this instance (%s) has tag %s=%s, not %s", self, key, value, want)
		}
		return &exitError{code: exitFailure, err: fmt.Errorf("%s; another instance may lead, which this instance's metadata cannot name (aws ec2 describe-instances --filters Name=tag-key,Values=%s Name=instance-state-name,Values=running can)", why, key)}
	}
	if c.json {
		return nil
	}
	line := "holder=" + self
	if token != "" {
		line += " token=" + token
	}
	line += fmt.Sprintf(" tag=%s=%s", key, value)
	_, err = fmt.Fprintln(out, line)
	return err
}
