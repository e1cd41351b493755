package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/batonhq/baton/aws"
)

// ruleScheme is the --backend scheme of an Auto Scaling group's own rule
// (is-leader and leader only). It is not a backendurl scheme: the rule
// needs the AWS SDK, which the root module does not import.
const ruleScheme = "aws-asg"

// ruleForm is the URL form, for messages and help.
const ruleForm = "aws-asg://[GROUP]"

// errRuleNoLease is why run and cron refuse aws-asg://.
var errRuleNoLease = errors.New("aws-asg:// is the group's rule (the InService, Healthy instance with the lowest id), for is-leader and leader only: it holds no lease and gives no fencing token, so two instances could run the command at once while the group changes; run it under a lease among the group's instances with --backend raft:// --join aws-asg")

// isRuleURL reports whether raw names the aws-asg:// scheme.
func isRuleURL(raw string) bool {
	scheme, _, ok := strings.Cut(raw, "://")
	return ok && strings.EqualFold(scheme, ruleScheme)
}

// parseRuleURL returns the group that an aws-asg://[GROUP] URL names
// ("" for this instance's own group), or why the URL is not one. GROUP is
// percent-decoded; Auto Scaling allows 1-255 characters, none of them
// control characters.
func parseRuleURL(raw string) (string, error) {
	_, rest, _ := strings.Cut(raw, "://")
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return "", fmt.Errorf("%q: aws-asg:// takes no query or fragment (the region and credentials come from AWS_REGION, AWS_PROFILE and the other AWS_* variables); use %s", rest[i:], ruleForm)
	}
	if strings.Contains(rest, "@") {
		return "", fmt.Errorf("aws-asg:// takes no user information (credentials come from AWS_* variables, a profile or the instance profile); use %s", ruleForm)
	}
	group, err := url.PathUnescape(rest)
	if err != nil {
		return "", fmt.Errorf("group %q: %v: write a literal %% as %%25; use %s", rest, err, ruleForm)
	}
	switch {
	case strings.HasPrefix(group, "/"):
		return "", fmt.Errorf("group %q starts with /: write aws-asg:// for this instance's own group, or aws-asg://NAME", group)
	case len(group) > 255:
		return "", fmt.Errorf("group name is %d bytes long: Auto Scaling group names have at most 255; use %s", len(group), ruleForm)
	case strings.IndexFunc(group, unicode.IsControl) >= 0 || !utf8.ValidString(group):
		return "", fmt.Errorf("group %q holds control characters or invalid UTF-8, which no Auto Scaling group name does; use %s", group, ruleForm)
	}
	return group, nil
}

// instanceIDPattern is an EC2 instance ID: i- and 8 or 17 hex digits.
var instanceIDPattern = regexp.MustCompile(`^i-([0-9a-f]{8}|[0-9a-f]{17})$`)

// validateRule returns the problems with the common flags when --backend is
// aws-asg://, and records the group. Only is-leader and leader take the
// rule; --lease is not needed (the rule knows no leases).
func (c *commonFlags) validateRule() []string {
	var problems []string
	src := flagSource(c.fs, "backend")
	if !c.rule {
		problems = append(problems, fmt.Sprintf("%s %s: %v", src, c.backend, errRuleNoLease))
	} else if g, err := parseRuleURL(c.backend); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: %v", src, c.backend, err))
	} else {
		c.ruleGroup, c.isRule = g, true
	}
	// Only a command-line --id names the instance: a BATON_ID set for
	// `baton run` is a candidate id, not an instance id.
	if c.rule && c.fs.Lookup("id").Changed && c.ruleSelf && !instanceIDPattern.MatchString(c.id) {
		problems = append(problems, fmt.Sprintf("--id %q: with %s, --id names an EC2 instance (i-0123456789abcdef0); omit it to ask about this instance", c.id, ruleForm))
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		problems = append(problems, fmt.Sprintf("%s %q: %v", flagSource(c.fs, "log-level"), c.logLevel, err))
	}
	return problems
}

// askRule runs the group's rule within timeout. self asks for this
// instance's ID (from IMDSv2) too. Its errors carry their exit status: 2
// for what the user must fix (region, credentials, group, permissions), 3
// for everything else, so that an AWS error is never read as "not the
// leader".
func (a *App) askRule(ctx context.Context, c *commonFlags, timeout time.Duration, self bool) (aws.RuleLeader, bool, error) {
	qctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	log := c.logger(a.stderr())
	lead, ok, err := aws.LeaderByRule(qctx, aws.RuleOptions{Group: c.ruleGroup, Self: self, Logger: log})
	if err == nil {
		return lead, ok, nil
	}
	what := "this instance's group"
	if c.ruleGroup != "" {
		what = fmt.Sprintf("group %q", c.ruleGroup)
	}
	switch {
	case stoppedBySignal(ctx):
		return lead, false, &exitError{code: exitUndetermined, err: fmt.Errorf("interrupted (%v) before AWS answered", context.Cause(ctx))}
	case errors.Is(err, aws.ErrNoRegion), errors.Is(err, aws.ErrNoCredentials):
		return lead, false, &exitError{code: exitUsage, err: err}
	case errors.Is(err, aws.ErrNotInGroup):
		return lead, false, &exitError{code: exitUsage, err: fmt.Errorf("%w: name the group, as in --backend aws-asg://GROUP", err)}
	case errors.Is(err, aws.ErrGroupNotFound):
		return lead, false, &exitError{code: exitUsage, err: fmt.Errorf("%w: check the name and the region (AWS_REGION)", err)}
	case qctx.Err() != nil:
		return lead, false, &exitError{code: exitUndetermined, err: fmt.Errorf("no answer from AWS about %s within --timeout %s (%v): raise --timeout, or check the network and AWS's health", what, timeout, err)}
	case errors.Is(err, aws.ErrIdentity) && !transientHTTP(err):
		hint := "run it on an instance of the group, or use 'baton leader --backend aws-asg://GROUP' elsewhere (with AWS_REGION)"
		if c.ruleGroup == "" {
			hint = "run it on an instance of the group, or name the group (aws-asg://GROUP) and set AWS_REGION"
		}
		return lead, false, &exitError{code: exitUsage, err: fmt.Errorf("%w: %s", err, hint)}
	case refusedCredentials(err):
		return lead, false, &exitError{code: exitUsage, err: fmt.Errorf("AWS refused the request about %s: %w; the rule needs autoscaling:DescribeAutoScalingGroups, autoscaling:DescribeAutoScalingInstances and ec2:DescribeInstances (see docs/aws.md)", what, err)}
	}
	return lead, false, &exitError{code: exitUndetermined, err: fmt.Errorf("asking AWS about %s: %w", what, err)}
}

// refusedCredentials reports whether AWS refused the request's credentials
// or permissions, which retrying cannot fix.
func refusedCredentials(err error) bool {
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.ErrorCode() {
	case "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
		"InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken", "UnrecognizedClientException":
		return true
	}
	return false
}

// transientHTTP reports whether err came with an HTTP status that says
// "try again": 429 or 5xx, or a throttling error.
func transientHTTP(err error) bool {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		if s := re.HTTPStatusCode(); s == 429 || s >= 500 {
			return true
		}
	}
	return retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err).Bool()
}

// ruleIsLeader answers is-leader by the group's rule: 0 when this instance
// (--id, or the instance from IMDSv2) is the rule's leader, 1 when another
// is or none qualifies, 2 and 3 as askRule says.
func (c *isLeaderCommand) ruleIsLeader(ctx context.Context) error {
	self := c.common.id
	if !c.fs.Lookup("id").Changed {
		self = ""
	}
	lead, ok, err := c.app.askRule(ctx, &c.common, c.timeout, self == "")
	if err != nil {
		return err
	}
	if self == "" {
		self = lead.Self
	}
	out := c.app.stdout()
	switch {
	case !ok:
		if c.verbose {
			fmt.Fprintf(out, "not leader: %s\n", lead.Decided)
		}
		return &exitError{code: exitFailure}
	case lead.InstanceID == self:
		if c.verbose {
			fmt.Fprintf(out, "leader: instance=%s private_ip=%s (%s)\n", lead.InstanceID, lead.PrivateIP, lead.Decided)
		}
		return nil
	default:
		if c.verbose {
			fmt.Fprintf(out, "not leader: instance=%s private_ip=%s leads (%s); this is %s\n", lead.InstanceID, lead.PrivateIP, lead.Decided, self)
		}
		return &exitError{code: exitFailure}
	}
}

// ruleJSON is leader --json's document for aws-asg://. InstanceID is a
// pointer so that "nobody" is an explicit null.
type ruleJSON struct {
	Backend    string  `json:"backend"`
	Group      string  `json:"group"`
	InstanceID *string `json:"instance_id"`
	PrivateIP  string  `json:"private_ip,omitempty"`
	Decided    string  `json:"decided"`
}

// ruleLeader prints the group rule's leader.
func (c *leaderCommand) ruleLeader(ctx context.Context) error {
	lead, ok, err := c.app.askRule(ctx, &c.common, c.timeout, false)
	if err != nil {
		return err
	}
	out := c.app.stdout()
	doc := ruleJSON{Backend: ruleScheme, Group: lead.Group, PrivateIP: lead.PrivateIP, Decided: lead.Decided}
	if ok {
		doc.InstanceID = &lead.InstanceID
	}
	if c.json {
		b, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s\n", b)
	}
	if !ok {
		return &exitError{code: exitFailure, err: fmt.Errorf("nobody leads: %s", lead.Decided)}
	}
	if !c.json {
		_, err = fmt.Fprintf(out, "instance=%s private_ip=%s group=%s decided=%q\n", lead.InstanceID, lead.PrivateIP, lead.Group, lead.Decided)
	}
	return err
}
