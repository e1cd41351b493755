package aws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// DefaultTagValue is the value of the leader tag when ParseTag's argument
// gives none.
const DefaultTagValue = "true"

// TokenTagSuffix is appended to the leader tag's key to make the key of the
// tag that holds the lease's fencing token: "app:isLeader" and
// "app:isLeader-token".
const TokenTagSuffix = "-token"

// EC2's limits on a tag, and on tag keys served in the instance metadata.
const (
	// MaxTagKey is the most characters of a leader tag's key: EC2 allows
	// 127 in a key (its API reference; other services allow 128), and
	// KEY-token must fit too.
	MaxTagKey = 127 - len(TokenTagSuffix)

	// MaxTagValue is the most characters of a tag's value.
	MaxTagValue = 256

	// DefaultTagMaxBackoff is the default TagOptions.RetryMaxBackoff.
	DefaultTagMaxBackoff = 5 * time.Second

	// tagFirstBackoff is the first wait after a retryable error; each
	// further one doubles, up to RetryMaxBackoff.
	tagFirstBackoff = 100 * time.Millisecond
)

// ErrInvalidTag reports a leader tag that EC2 or the instance metadata
// would refuse. ParseTag's errors wrap it.
var ErrInvalidTag = errors.New("aws: invalid tag")

// ParseTag parses the leader tag "KEY[=VALUE]": the key up to the first
// "=", the value after it, DefaultTagValue ("true") when there is no "=".
// An empty value ("KEY=") is kept as given.
//
// The key must be 1-121 characters (MaxTagKey, so that KEY-token fits in
// EC2's 127), must not start with "aws:" (reserved by AWS), and may hold
// only letters, digits and + - = . , _ : @ (no spaces or "/"), and must not
// be ".", ".." or "_index": those are the keys that the instance metadata
// can serve, and EC2 refuses other keys on an instance whose tags are in
// its metadata. The value must be valid UTF-8 of at most 256 characters.
// Errors wrap ErrInvalidTag and say how to fix the tag.
func ParseTag(s string) (key, value string, err error) {
	key, value, hasValue := strings.Cut(s, "=")
	if !hasValue {
		value = DefaultTagValue
	}
	if err := checkLeaderTagKey(key); err != nil {
		return "", "", err
	}
	if !utf8.ValidString(value) {
		return "", "", fmt.Errorf("%w: the value of tag %q is not valid UTF-8", ErrInvalidTag, key)
	}
	if n := utf8.RuneCountInString(value); n > MaxTagValue {
		return "", "", fmt.Errorf("%w: the value of tag %q is %d characters long; EC2 allows at most %d", ErrInvalidTag, key, n, MaxTagValue)
	}
	return key, value, nil
}

func checkLeaderTagKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: the key is empty: want KEY or KEY=VALUE, such as app:isLeader", ErrInvalidTag)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: the key %q is not valid UTF-8", ErrInvalidTag, key)
	}
	if n := utf8.RuneCountInString(key); n > MaxTagKey {
		return fmt.Errorf("%w: the key is %d characters long; at most %d, so that the key with %q (the fencing token's tag) fits EC2's 127",
			ErrInvalidTag, n, MaxTagKey, TokenTagSuffix)
	}
	if strings.HasPrefix(strings.ToLower(key), "aws:") {
		return fmt.Errorf("%w: the key %q starts with \"aws:\", which AWS reserves for its own tags; choose another prefix, such as app:", ErrInvalidTag, key)
	}
	switch key {
	case ".", "..", "_index":
		return fmt.Errorf("%w: the key %q cannot be served in the instance metadata; choose another", ErrInvalidTag, key)
	}
	for _, r := range key {
		if !imdsKeyRune(r) {
			return fmt.Errorf("%w: the key %q holds %q; the instance metadata serves only keys of letters, digits and + - = . , _ : @",
				ErrInvalidTag, key, r)
		}
	}
	return nil
}

func imdsKeyRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("+-=.,_:@", r)
}

// TagAPI is the part of the EC2 client that a Tagger uses. *ec2.Client
// implements it.
type TagAPI interface {
	CreateTags(ctx context.Context, in *ec2.CreateTagsInput, optFns ...func(*ec2.Options)) (*ec2.CreateTagsOutput, error)
	DeleteTags(ctx context.Context, in *ec2.DeleteTagsInput, optFns ...func(*ec2.Options)) (*ec2.DeleteTagsOutput, error)
}

var _ TagAPI = (*ec2.Client)(nil)

// TagOptions configures NewTagger.
type TagOptions struct {
	// Key is the leader tag's key, such as "app:isLeader", and Value its
	// value; see ParseTag. Key is required. Value may be empty, which is
	// the empty value, not DefaultTagValue: ParseTag applies that default.
	Key, Value string

	// Group is the Auto Scaling group whose other instances lose the tag
	// when this one is elected. Empty (the default) means InstanceID's
	// group, found with DescribeAutoScalingInstances on the first Elected.
	Group string

	// InstanceID is this instance's ID, the one that gets the tag.
	// Required.
	InstanceID string

	// EC2 writes the tags. Required; it must implement TagAPI too, as
	// *ec2.Client does.
	EC2 EC2API

	// ASG lists the group's instances (DescribeAutoScalingGroups) and,
	// without Group, finds this instance's group. Required.
	ASG ASGAPI

	// RetryMaxBackoff caps the wait between two tries of a call that
	// failed with throttling, a 5xx or a network error. Such calls are
	// tried again until they succeed or the context ends, the first wait
	// 100ms and each further one twice as long, with jitter. This is on
	// top of the clients' own retries. Zero means DefaultTagMaxBackoff
	// (5s).
	RetryMaxBackoff time.Duration

	// Logger receives the Tagger's records, in the group "tag". Nil (the
	// default) discards them.
	Logger *slog.Logger
}

// Tagger marks the instance that holds a lease with an EC2 tag, so that
// programs that cannot ask the lease read the tag instead, from the
// instance metadata (tags/instance/KEY) or with DescribeTags. What such a
// reader can and cannot rely on:
//
//   - A Tagger never tags its own instance before every other instance of
//     the group has had KEY and KEY-token removed: Elected deletes them
//     first, and writes its own only once those deletes succeeded. It
//     deletes them from every other instance of the group, not only from
//     those a read shows tagged, because a tag written a moment ago may
//     not show in reads yet.
//   - The tag lags the lease. EC2 tags are eventually consistent: a write
//     shows in DescribeTags and the instance metadata only after a
//     propagation delay (usually seconds), and a write sent just before a
//     term ended may still land after it. So a reader may see no tagged
//     instance (between two leaders, or while the writes propagate), and
//     for a short while it may see the old leader still tagged. KEY-token,
//     the lease's fencing token, tells an older term from a newer one.
//   - A leader that dies without resigning leaves its tag until the next
//     leader is elected and removes it.
//
// For an exact answer a script should ask the lease (baton is-leader), not
// the tag.
//
// Call Elected when a term starts, with a context that ends with the term,
// and Demoted when the term ends, after cancelling Elected's context,
// whatever Elected returned: a tag write in flight when the term ended may
// have landed.
//
// A Tagger is safe for concurrent use; its calls run one at a time.
type Tagger struct {
	opts TagOptions
	ec2  TagAPI
	log  *slog.Logger
	rand func() float64

	sem   chan struct{} // holds one value while a call runs
	group string        // set by the first call that needed it
}

// NewTagger returns a Tagger. It validates opts, reporting every problem
// at once in an error that wraps an *OptionsError, and does no I/O.
func NewTagger(opts TagOptions) (*Tagger, error) {
	var e OptionsError
	if err := checkLeaderTagKey(opts.Key); err != nil {
		e.add(fmt.Sprintf("Key: %v", err))
	}
	if n := utf8.RuneCountInString(opts.Value); n > MaxTagValue || !utf8.ValidString(opts.Value) {
		e.add(fmt.Sprintf("Value is not valid UTF-8 of at most %d characters", MaxTagValue))
	}
	if opts.InstanceID == "" {
		e.add("InstanceID is empty: want this instance's ID, such as i-0123456789abcdef0")
	}
	var tags TagAPI
	if opts.EC2 == nil {
		e.add("EC2 is nil: want an EC2 client, such as ec2.NewFromConfig(cfg)")
	} else if t, ok := opts.EC2.(TagAPI); !ok {
		e.add(fmt.Sprintf("EC2 (%T) has no CreateTags and DeleteTags: want a client that implements TagAPI, such as *ec2.Client", opts.EC2))
	} else {
		tags = t
	}
	if opts.ASG == nil {
		e.add("ASG is nil: want an Auto Scaling client, such as autoscaling.NewFromConfig(cfg)")
	}
	if opts.RetryMaxBackoff < 0 {
		e.add(fmt.Sprintf("RetryMaxBackoff %s is negative: want 0 for the default (%s) or a positive duration", opts.RetryMaxBackoff, DefaultTagMaxBackoff))
	}
	if len(opts.Group) > 255 {
		e.add(fmt.Sprintf("Group is %d characters long: Auto Scaling group names have at most 255", len(opts.Group)))
	}
	if len(e.Problems) > 0 {
		return nil, tagOptionsError{&e}
	}
	if opts.RetryMaxBackoff == 0 {
		opts.RetryMaxBackoff = DefaultTagMaxBackoff
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Tagger{
		opts:  opts,
		ec2:   tags,
		log:   log.WithGroup("tag").With("key", opts.Key, "instance", opts.InstanceID),
		rand:  rand.Float64,
		sem:   make(chan struct{}, 1),
		group: opts.Group,
	}, nil
}

// tagOptionsError is an *OptionsError (errors.As finds it) that names the
// leader tag rather than discovery as what was misconfigured.
type tagOptionsError struct{ *OptionsError }

func (e tagOptionsError) Error() string {
	return "aws: leader tag: invalid options: " + strings.Join(e.Problems, "; ")
}

func (e tagOptionsError) Unwrap() error { return e.OptionsError }

// TokenKey is the key of the tag that holds the fencing token: Key with
// TokenTagSuffix.
func (t *Tagger) TokenKey() string { return t.opts.Key + TokenTagSuffix }

// Elected removes Key and TokenKey from every other instance of the group
// and then, once those deletes succeeded, tags this instance with
// Key=Value and TokenKey=token. Throttling, 5xx and network errors are
// retried until ctx ends; any other error is returned at once. If ctx ends
// before this instance is tagged, Elected does not tag it and returns an
// error that wraps ctx's.
func (t *Tagger) Elected(ctx context.Context, token uint64) error {
	if err := t.acquire(ctx); err != nil {
		return fmt.Errorf("aws: leader tag: %w", err)
	}
	defer t.release()

	group, err := t.ownGroup(ctx)
	if err != nil {
		return err
	}
	others, err := t.others(ctx, group)
	if err != nil {
		return err
	}
	if err := t.untag(ctx, others); err != nil {
		return err
	}
	// The deletes above are the guarantee; a term that ended while they
	// ran must not tag this instance after them.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("aws: leader tag: the term ended before %s was tagged: %w", t.opts.InstanceID, err)
	}
	tok := strconv.FormatUint(token, 10)
	err = t.retry(ctx, "CreateTags", func(ctx context.Context) error {
		_, err := t.ec2.CreateTags(ctx, &ec2.CreateTagsInput{
			Resources: []string{t.opts.InstanceID},
			Tags: []ec2types.Tag{
				{Key: sdkaws.String(t.opts.Key), Value: sdkaws.String(t.opts.Value)},
				{Key: sdkaws.String(t.TokenKey()), Value: sdkaws.String(tok)},
			},
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("aws: leader tag: CreateTags on %s: %w", t.opts.InstanceID, err)
	}
	t.log.Info("tagged", "group", group, "token", token, "untagged", len(others))
	return nil
}

// Demoted removes Key and TokenKey from this instance, retrying as Elected
// does until ctx ends. It waits for an Elected still running, which ends
// when Elected's context does.
func (t *Tagger) Demoted(ctx context.Context) error {
	if err := t.acquire(ctx); err != nil {
		return fmt.Errorf("aws: leader tag: %w", err)
	}
	defer t.release()
	if err := t.untagBatch(ctx, []string{t.opts.InstanceID}); err != nil {
		return err
	}
	t.log.Info("untagged")
	return nil
}

func (t *Tagger) acquire(ctx context.Context) error {
	select {
	case t.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *Tagger) release() { <-t.sem }

// ownGroup returns the group, finding it on first use. The caller holds
// t.sem.
func (t *Tagger) ownGroup(ctx context.Context) (string, error) {
	if t.group != "" {
		return t.group, nil
	}
	var group string
	err := t.retry(ctx, "DescribeAutoScalingInstances", func(ctx context.Context) error {
		var err error
		group, err = ownGroup(ctx, t.opts.ASG, t.opts.InstanceID)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("aws: leader tag: %w", err)
	}
	t.group = group
	return group, nil
}

// others lists the group's instances other than this one, in any
// lifecycle state: a Terminating instance may still carry the tag.
func (t *Tagger) others(ctx context.Context, group string) ([]string, error) {
	var ids []string
	err := t.retry(ctx, "DescribeAutoScalingGroups", func(ctx context.Context) error {
		ids = ids[:0]
		found := false
		pages := autoscaling.NewDescribeAutoScalingGroupsPaginator(t.opts.ASG, &autoscaling.DescribeAutoScalingGroupsInput{
			AutoScalingGroupNames: []string{group},
		})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				return err
			}
			for _, g := range page.AutoScalingGroups {
				if sdkaws.ToString(g.AutoScalingGroupName) != group {
					continue
				}
				found = true
				for _, in := range g.Instances {
					if id := sdkaws.ToString(in.InstanceId); id != "" && id != t.opts.InstanceID {
						ids = append(ids, id)
					}
				}
			}
		}
		if !found {
			return fmt.Errorf("%w: %q", ErrGroupNotFound, group)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("aws: leader tag: DescribeAutoScalingGroups %q: %w", group, err)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

// untag deletes Key and TokenKey from ids, DescribeInstancesBatch at a
// time.
func (t *Tagger) untag(ctx context.Context, ids []string) error {
	for batch := range slices.Chunk(ids, DescribeInstancesBatch) {
		if err := t.untagBatch(ctx, batch); err != nil {
			return err
		}
	}
	return nil
}

// untagBatch deletes Key and TokenKey, whatever their values, from ids in
// one request. EC2 fails the whole request if one instance no longer
// exists (it was terminated and purged after the group listed it); then
// each is tried alone, and the ones that do not exist, which carry no tag,
// are skipped.
func (t *Tagger) untagBatch(ctx context.Context, ids []string) error {
	del := func(ctx context.Context, ids []string) error {
		return t.retry(ctx, "DeleteTags", func(ctx context.Context) error {
			_, err := t.ec2.DeleteTags(ctx, &ec2.DeleteTagsInput{
				Resources: ids,
				Tags:      []ec2types.Tag{{Key: sdkaws.String(t.opts.Key)}, {Key: sdkaws.String(t.TokenKey())}},
			})
			return err
		})
	}
	err := del(ctx, ids)
	if err != nil && len(ids) > 1 && isNotFound(err) {
		err = nil
		for _, id := range ids {
			if e := del(ctx, []string{id}); e != nil && !isNotFound(e) {
				err = e
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("aws: leader tag: DeleteTags %s and %s on %d instances (%s): %w", t.opts.Key, t.TokenKey(), len(ids), strings.Join(ids, " "), err)
	}
	return nil
}

func isNotFound(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "InvalidInstanceID.NotFound"
}

// retry calls call until it succeeds, fails with an error that is not
// retryable, or ctx ends, waiting with exponential backoff and jitter
// between tries.
func (t *Tagger) retry(ctx context.Context, action string, call func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := call(ctx)
		if err != nil && ctx.Err() != nil {
			return fmt.Errorf("%w (the last try: %w)", ctx.Err(), err)
		}
		if err == nil || !retryable(err) {
			return err
		}
		d := tagBackoff(attempt, t.opts.RetryMaxBackoff, t.rand())
		t.log.Debug("retrying", "action", action, "attempt", attempt, "wait", d, "err", err)
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("%w (after %d tries, the last: %w)", ctx.Err(), attempt, err)
		}
	}
}

// tagBackoff is the wait after the given failed attempt (1 for the first):
// tagFirstBackoff doubled per attempt, capped at max, then drawn within
// its upper half by r in [0,1), so that instances throttled together do
// not retry in step.
func tagBackoff(attempt int, max time.Duration, r float64) time.Duration {
	d := tagFirstBackoff
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return d/2 + time.Duration(r*float64(d/2))
}
