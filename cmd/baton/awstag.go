package main

import (
	"context"
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
	cfg, err := config.LoadDefaultConfig(ctx, config.WithRegion("us-east-1"))
	if err != nil {
		return &exitError{code: exitUsage, err: fmt.Errorf("loading the AWS configuration: %w", err)}
	}
	client := imds.NewFromConfig(cfg, func(o *imds.Options) { o.EnableFallback = sdkaws.FalseTernary })
	start := time.Now()
	out, err := client.GetMetadata(ctx, &imds.GetMetadataInput{Path: "tags/instance/" + key})
	if err != nil {
		var re *smithyhttp.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() == 404 {
			// No such tag. (With tags in metadata off, the tags path itself
			// is 404 too: check it, so that this is not read as "not leader".)
			if _, lerr := client.GetMetadata(ctx, &imds.GetMetadataInput{Path: "tags/instance"}); lerr != nil {
				return &exitError{code: exitUndetermined, err: fmt.Errorf("baton: the instance's tags are not in its metadata (turn on InstanceMetadataTags in the launch template): %w", lerr)}
			}
			if c.verbose {
				fmt.Fprintf(c.app.stdout(), "not leader: no tag %s on this instance\n", key)
			}
			return &exitError{code: exitFailure}
		}
		return &exitError{code: exitUndetermined, err: fmt.Errorf("baton: reading tag %s from the instance metadata (IMDSv2) failed after %s: %w", key, time.Since(start).Round(time.Millisecond), err)}
	}
	defer out.Content.Close()
	b, err := io.ReadAll(out.Content)
	if err != nil {
		return &exitError{code: exitUndetermined, err: fmt.Errorf("baton: reading tag %s: %w", key, err)}
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
