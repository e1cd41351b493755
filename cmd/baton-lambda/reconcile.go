package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/dynamodb"
)

// ASGAPI is what the election needs of Auto Scaling.
type ASGAPI interface {
	DescribeAutoScalingGroups(ctx context.Context, in *autoscaling.DescribeAutoScalingGroupsInput, opts ...func(*autoscaling.Options)) (*autoscaling.DescribeAutoScalingGroupsOutput, error)
}

// EC2API is what the election needs of EC2: the tags.
type EC2API interface {
	DescribeTags(ctx context.Context, in *ec2.DescribeTagsInput, opts ...func(*ec2.Options)) (*ec2.DescribeTagsOutput, error)
	CreateTags(ctx context.Context, in *ec2.CreateTagsInput, opts ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
	DeleteTags(ctx context.Context, in *ec2.DeleteTagsInput, opts ...func(*ec2.Options)) (*ec2.DeleteTagsOutput, error)
}

// Config is the election's configuration (from the function's environment).
type Config struct {
	// TagKey and TagValue mark the leader: BATON_TAG_KEY (default
	// app:isLeader), BATON_TAG_VALUE (default true).
	TagKey, TagValue string
	// TokenKey holds the leader's fencing token: BATON_TOKEN_TAG_KEY
	// (default TagKey + "-token").
	TokenKey string
	// LockTTL is the TTL of the lease that admits one invocation per group
	// at a time: BATON_LOCK_TTL (default 15s).
	LockTTL time.Duration
}

// elector elects, for one group at a time, the leader the tags show.
type elector struct {
	cfg Config
	db  dynamodb.API
	tbl string
	asg ASGAPI
	ec2 EC2API
	log *slog.Logger
}

// choice is what the lease's state keeps: the leader elected and the token
// of the term that elected it.
type choice struct {
	Leader string `json:"leader"`
	Token  uint64 `json:"token"`
}

// reconcile makes the group's tags name its leader: the current one while
// it is InService and Healthy, otherwise the lowest-id instance that is.
// It holds the group's lease in DynamoDB throughout, so that a second
// invocation waits for it; every EC2 write is made before the lease's
// safe-until, and none after the lease is lost.
func (e *elector) reconcile(ctx context.Context, group, invocation string) error {
	b, err := dynamodb.New(ctx, e.db, dynamodb.Options{Config: backend.Config{TTL: e.cfg.LockTTL}, Table: e.tbl, NoCheck: true, Owner: "baton-lambda/" + invocation, Logger: e.log})
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(cctx)
	}()
	term, err := b.Campaign(ctx, "baton-lambda/"+group, baton.Candidate{ID: invocation})
	if err != nil {
		return fmt.Errorf("baton-lambda: group %s: take the election's lease: %w", group, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = term.Resign(rctx)
	}()
	st := term.(baton.StateTerm)
	raw, err := st.LoadState(ctx)
	if err != nil {
		return err
	}
	var prev choice
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &prev); err != nil {
			return fmt.Errorf("baton-lambda: group %s: the lease's state %q: %w", group, raw, err)
		}
	}
	// A request sent within the term: its context ends at safe-until.
	within := func() (context.Context, context.CancelFunc, error) {
		if err := term.Err(); err != nil {
			return nil, nil, err
		}
		c, cancel := context.WithDeadline(ctx, term.SafeUntil())
		return c, cancel, c.Err()
	}

	rctx, cancel, err := within()
	if err != nil {
		return err
	}
	out, err := e.asg.DescribeAutoScalingGroups(rctx, &autoscaling.DescribeAutoScalingGroupsInput{AutoScalingGroupNames: []string{group}})
	cancel()
	if err != nil {
		return fmt.Errorf("baton-lambda: group %s: %w", group, err)
	}
	if len(out.AutoScalingGroups) == 0 {
		return fmt.Errorf("baton-lambda: group %s does not exist", group)
	}
	var all, ready []string
	for _, in := range out.AutoScalingGroups[0].Instances {
		id := aws.ToString(in.InstanceId)
		all = append(all, id)
		if string(in.LifecycleState) == "InService" && aws.ToString(in.HealthStatus) == "Healthy" {
			ready = append(ready, id)
		}
	}
	slices.Sort(ready)
	next := choice{}
	switch {
	case prev.Leader != "" && slices.Contains(ready, prev.Leader):
		next = prev // no flap: the leader stays while InService and Healthy
	case len(ready) > 0:
		next = choice{Leader: ready[0], Token: term.Token()}
	}

	// Every instance but the leader loses the tag first.
	tagged, err := e.tagged(within, all)
	if err != nil {
		return fmt.Errorf("baton-lambda: group %s: read tags: %w", group, err)
	}
	for id, token := range tagged {
		if id == next.Leader && token == strconv.FormatUint(next.Token, 10) {
			continue
		}
		if id == next.Leader {
			continue // retagged below with the token
		}
		rctx, cancel, err := within()
		if err != nil {
			return err
		}
		_, err = e.ec2.DeleteTags(rctx, &ec2.DeleteTagsInput{Resources: []string{id}, Tags: []ec2types.Tag{{Key: aws.String(e.cfg.TagKey)}, {Key: aws.String(e.cfg.TokenKey)}}})
		cancel()
		if err != nil {
			return fmt.Errorf("baton-lambda: group %s: untag %s: %w", group, id, err)
		}
		e.log.Info("untagged", "group", group, "instance", id)
	}
	// The choice is stored, fenced by the lease, before the tag shows it.
	if next != prev {
		v, _ := json.Marshal(next)
		rctx, cancel, err := within()
		if err != nil {
			return err
		}
		err = st.StoreState(rctx, v)
		cancel()
		if err != nil {
			return fmt.Errorf("baton-lambda: group %s: store the election: %w", group, err)
		}
	}
	if next.Leader == "" {
		e.log.Warn("no instance is InService and Healthy: no leader", "group", group)
		return nil
	}
	token := strconv.FormatUint(next.Token, 10)
	if tagged[next.Leader] == token {
		return nil
	}
	rctx, cancel, err = within()
	if err != nil {
		return err
	}
	_, err = e.ec2.CreateTags(rctx, &ec2.CreateTagsInput{Resources: []string{next.Leader}, Tags: []ec2types.Tag{
		{Key: aws.String(e.cfg.TagKey), Value: aws.String(e.cfg.TagValue)},
		{Key: aws.String(e.cfg.TokenKey), Value: aws.String(token)},
	}})
	cancel()
	if err != nil {
		return fmt.Errorf("baton-lambda: group %s: tag %s: %w", group, next.Leader, err)
	}
	e.log.Info("tagged the leader", "group", group, "instance", next.Leader, "token", next.Token)
	return nil
}

// tagged returns the instances among ids that carry the leader tag, with
// the value of their token tag ("" if none).
func (e *elector) tagged(within func() (context.Context, context.CancelFunc, error), ids []string) (map[string]string, error) {
	out := map[string]string{}
	if len(ids) == 0 {
		return out, nil
	}
	var next *string
	for {
		ctx, cancel, err := within()
		if err != nil {
			return nil, err
		}
		page, err := e.ec2.DescribeTags(ctx, &ec2.DescribeTagsInput{
			Filters: []ec2types.Filter{
				{Name: aws.String("resource-id"), Values: ids},
				{Name: aws.String("key"), Values: []string{e.cfg.TagKey, e.cfg.TokenKey}},
			},
			NextToken: next,
		})
		cancel()
		if err != nil {
			return nil, err
		}
		tokens := map[string]string{}
		for _, t := range page.Tags {
			id := aws.ToString(t.ResourceId)
			switch aws.ToString(t.Key) {
			case e.cfg.TagKey:
				if _, ok := out[id]; !ok {
					out[id] = ""
				}
			case e.cfg.TokenKey:
				tokens[id] = aws.ToString(t.Value)
			}
		}
		for id, tok := range tokens {
			if _, ok := out[id]; ok {
				out[id] = tok
			}
		}
		if page.NextToken == nil || *page.NextToken == "" {
			return out, nil
		}
		next = page.NextToken
	}
}

// errNoGroups is the error of a scheduled event with no BATON_GROUPS.
var errNoGroups = errors.New("baton-lambda: a scheduled event, and BATON_GROUPS lists no group to reconcile")
