// Command baton-lambda is the election Lambda for Auto Scaling groups whose
// instances run no baton: it tags one InService and Healthy instance of
// each group with app:isLeader (key and value configurable) and its fencing
// token, for applications that read their own instance's tags from
// instance metadata (`baton is-leader --backend aws-tag://KEY`).
//
// # What it guarantees, and what not
//
//   - At most one tagged instance per group at any moment, as EC2 applies
//     the writes: every other instance's tag is deleted before the new
//     leader is tagged, so there may be a moment with none, never one with
//     two; also with two invocations at once (reserved concurrency
//     misconfigured): each group's election holds a lease in DynamoDB
//     (backend/dynamodb), so a second invocation waits, and every EC2
//     write is sent before that lease's safe-until.
//   - The leader is kept while it is InService and Healthy (no flap on
//     scale-out); otherwise the lowest-id InService and Healthy instance is
//     elected, and its token tag holds the election lease's fencing token,
//     which rises with every new leader.
//   - Idempotent: each invocation reads the group and the tags and makes
//     them agree, whatever event triggered it, so duplicated, reordered
//     and lost events (the schedule reconciles) change nothing more.
//   - Every AWS error is retried by the SDK (throttling, 5xx) or fails the
//     invocation, so that Lambda retries it; none is swallowed.
//
// Not guaranteed: a write sent before safe-until may land after it (a slow
// network), and tags reach instance metadata with EC2's delay, so a reader
// may briefly see a tag that is being removed. Readers that act on the tag
// compare tokens: an instance whose token tag is lower than the highest
// one seen is not the leader, and downstream writes carry the token.
//
// Configuration, from the environment: BATON_TABLE (the DynamoDB table,
// required), BATON_GROUPS (the groups a schedule reconciles, comma
// separated; events for others are refused), BATON_TAG_KEY, BATON_TAG_VALUE,
// BATON_TOKEN_TAG_KEY, BATON_LOCK_TTL; region, credentials and endpoints by
// the SDK's usual resolution.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/batonhq/baton/backend/dynamodb"
)

func main() {
	h, err := newHandler(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	lambda.Start(h.handle)
}

// handler is the function: its configuration and clients, made once per
// execution environment.
type handler struct {
	e      *elector
	groups []string
}

func newHandler(ctx context.Context) (*handler, error) {
	cfg := Config{
		TagKey:   envOr("BATON_TAG_KEY", "app:isLeader"),
		TagValue: envOr("BATON_TAG_VALUE", "true"),
		LockTTL:  15 * time.Second,
	}
	cfg.TokenKey = envOr("BATON_TOKEN_TAG_KEY", cfg.TagKey+"-token")
	if v := os.Getenv("BATON_LOCK_TTL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("baton-lambda: BATON_LOCK_TTL %q: want a positive duration such as 15s", v)
		}
		cfg.LockTTL = d
	}
	table := os.Getenv("BATON_TABLE")
	if err := dynamodb.CheckTableName(table); err != nil {
		return nil, fmt.Errorf("baton-lambda: BATON_TABLE: %w", err)
	}
	var groups []string
	for _, g := range strings.Split(os.Getenv("BATON_GROUPS"), ",") {
		if g = strings.TrimSpace(g); g != "" {
			groups = append(groups, g)
		}
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, config.WithRetryer(func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 6 })
	}))
	if err != nil {
		return nil, fmt.Errorf("baton-lambda: AWS configuration: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	return &handler{groups: groups, e: &elector{
		cfg: cfg, tbl: table, log: log,
		db:  awsdynamodb.NewFromConfig(awsCfg),
		asg: autoscaling.NewFromConfig(awsCfg),
		ec2: ec2.NewFromConfig(awsCfg),
	}}, nil
}

// handle reconciles every group the event names; the first error fails the
// invocation (after the other groups were tried).
func (h *handler) handle(ctx context.Context, event json.RawMessage) (string, error) {
	groups, err := groupsOf(event, h.groups)
	if err != nil {
		return "", err
	}
	if len(groups) == 0 && len(h.groups) == 0 {
		return "", errNoGroups
	}
	id := "local"
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		id = lc.AwsRequestID
	}
	var first error
	for _, g := range groups {
		if err := h.e.reconcile(ctx, g, id); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return "", first
	}
	return "reconciled " + strings.Join(groups, ","), nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
