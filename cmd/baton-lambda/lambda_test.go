package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsdynamodb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/batonhq/baton/backend/dynamodb"
	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testserver"
)

const (
	tagKey   = "app:isLeader"
	tokenKey = "app:isLeader-token"
)

var (
	buildOnce sync.Once
	bootstrap string
	buildErr  error
)

// buildBootstrap builds this function's bootstrap, as a provided.al2023
// deployment would (CGO off), once per test binary.
func buildBootstrap(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-lambda-")
		if err != nil {
			buildErr = err
			return
		}
		bootstrap = filepath.Join(dir, "bootstrap")
		cmd := exec.Command("go", "build", "-o", bootstrap, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bootstrap
}

// world is one Auto Scaling group (the fake EC2 and Auto Scaling APIs),
// the election's table (dynalite) and the function's environment.
type world struct {
	fake *awsfake.Server
	env  []string
}

func newWorld(t *testing.T, instances ...string) *world {
	t.Helper()
	d := testserver.StartDynalite(t)
	client := awsdynamodb.New(awsdynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(d.Endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDBATONTEST", SecretAccessKey: "secret"}, nil
		}),
		HTTPClient: &http.Client{},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := dynamodb.CreateTable(ctx, client, "baton-lambda"); err != nil {
		t.Fatal(err)
	}
	f := awsfake.Start(t)
	f.AddGroup("web")
	for i, id := range instances {
		f.Launch(id, "web", "InService", "Healthy", fmt.Sprintf("10.0.0.%d", i+1))
	}
	none := filepath.Join(t.TempDir(), "none")
	return &world{fake: f, env: []string{
		"AWS_ACCESS_KEY_ID=AKIDBATONTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=" + f.URL(), "AWS_ENDPOINT_URL_DYNAMODB=" + d.Endpoint,
		"AWS_CONFIG_FILE=" + none, "AWS_SHARED_CREDENTIALS_FILE=" + none, "AWS_EC2_METADATA_DISABLED=true",
		"BATON_TABLE=baton-lambda", "BATON_GROUPS=web", "BATON_LOCK_TTL=5s",
	}}
}

// function starts one execution environment of the function: its real
// bootstrap under the Runtime Interface Emulator.
func (w *world) function(t *testing.T) *testserver.LambdaRIEProc {
	return testserver.StartLambdaRIE(t, buildBootstrap(t), w.env)
}

// The events AWS sends.
func scheduled() []byte {
	return []byte(`{"version":"0","id":"53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa","detail-type":"Scheduled Event","source":"aws.events","account":"123456789012","time":"2026-11-27T20:00:00Z","region":"us-east-1","resources":["arn:aws:events:us-east-1:123456789012:rule/baton-lambda-reconcile"],"detail":{}}`)
}

func snsNotification(event, instance string) []byte {
	msg := fmt.Sprintf(`{"Origin":"AutoScalingGroup","Destination":"EC2","Progress":50,"AccountId":"123456789012","Description":"%s %s","RequestId":"0f7c5d0f","EndTime":"2026-11-27T20:00:00Z","AutoScalingGroupARN":"arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:1:autoScalingGroupName/web","ActivityId":"0f7c5d0f","StartTime":"2026-11-27T19:59:00Z","Service":"AWS Auto Scaling","Time":"2026-11-27T20:00:00Z","EC2InstanceId":"%s","StatusCode":"InProgress","StatusMessage":"","Details":{"Subnet ID":"subnet-1","Availability Zone":"us-east-1a"},"AutoScalingGroupName":"web","Cause":"test","Event":"%s"}`, event, instance, instance, event)
	return []byte(fmt.Sprintf(`{"Records":[{"EventSource":"aws:sns","EventVersion":"1.0","EventSubscriptionArn":"arn:aws:sns:us-east-1:123456789012:asg:1","Sns":{"Type":"Notification","MessageId":"95df01b4","TopicArn":"arn:aws:sns:us-east-1:123456789012:asg","Subject":"Auto Scaling","Message":%q,"Timestamp":"2026-11-27T20:00:00.000Z","SignatureVersion":"1","Signature":"x","SigningCertUrl":"https://sns","UnsubscribeUrl":"https://sns","MessageAttributes":{}}}]}`, msg))
}

func eventBridge(detailType, instance string) []byte {
	return []byte(fmt.Sprintf(`{"version":"0","id":"3e3c153a","detail-type":%q,"source":"aws.autoscaling","account":"123456789012","time":"2026-11-27T20:00:00Z","region":"us-east-1","resources":["arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:1:autoScalingGroupName/web"],"detail":{"LifecycleActionToken":"87654321","AutoScalingGroupName":"web","LifecycleHookName":"drain","EC2InstanceId":%q,"LifecycleTransition":"autoscaling:EC2_INSTANCE_TERMINATING"}}`, detailType, instance))
}

func invoke(t *testing.T, fn *testserver.LambdaRIEProc, event []byte) {
	t.Helper()
	start := time.Now()
	if _, err := fn.Invoke(event); err != nil {
		t.Fatalf("invoke: %v", err)
	}
	t.Logf("invocation took %s", time.Since(start).Round(time.Millisecond))
}

// leader returns the one instance whose tags (as reads see them) carry the
// leader tag, and its token, failing on two.
func (w *world) leader(t *testing.T, ids ...string) (string, string) {
	t.Helper()
	var got []string
	token := ""
	for _, id := range ids {
		tags := w.fake.Tags(id)
		if _, ok := tags[tagKey]; ok {
			got = append(got, id)
			token = tags[tokenKey]
		}
	}
	if len(got) > 1 {
		t.Fatalf("%d tagged leaders: %v", len(got), got)
	}
	if len(got) == 0 {
		return "", ""
	}
	return got[0], token
}

// neverTwo replays every tag write EC2 accepted, in order, and fails if
// two instances ever carried the leader tag at once.
func (w *world) neverTwo(t *testing.T) {
	t.Helper()
	writes := w.fake.TagWrites()
	sort.Slice(writes, func(i, j int) bool { return writes[i].Seq < writes[j].Seq })
	held := map[string]bool{}
	for _, wr := range writes {
		if wr.Key != tagKey {
			continue
		}
		held[wr.Instance] = wr.Action == "CreateTags"
		var who []string
		for id, on := range held {
			if on {
				who = append(who, id)
			}
		}
		if len(who) > 1 {
			t.Fatalf("after tag write %d (%s %s), %d instances carried %s: %v", wr.Seq, wr.Action, wr.Instance, len(who), tagKey, who)
		}
	}
}

// leaderWrites counts the tag writes of the leader tag.
func (w *world) leaderWrites() int {
	n := 0
	for _, wr := range w.fake.TagWrites() {
		if wr.Key == tagKey {
			n++
		}
	}
	return n
}

// TestElectKeepReelect: the lowest-id InService and Healthy instance is
// elected; a scale-out keeps it (no tag write); a leader entering
// Terminating:Wait loses the tag to the next, before its hook completes;
// an unhealthy leader too; tokens rise; never two tags.
func TestElectKeepReelect(t *testing.T) {
	w := newWorld(t, "i-0c", "i-0a", "i-0b")
	fn := w.function(t)
	invoke(t, fn, scheduled())
	ids := []string{"i-0a", "i-0b", "i-0c", "i-09"}
	l, tok1 := w.leader(t, ids...)
	if l != "i-0a" || tok1 == "" {
		t.Fatalf("leader %q token %q; want i-0a with a token", l, tok1)
	}

	// Scale-out: a lower id arrives; the leader stays, nothing is written.
	w.fake.Launch("i-09", "web", "InService", "Healthy", "10.0.0.9")
	before := w.leaderWrites()
	invoke(t, fn, snsNotification("autoscaling:EC2_INSTANCE_LAUNCH", "i-09"))
	if l, tok := w.leader(t, ids...); l != "i-0a" || tok != tok1 {
		t.Errorf("after scale-out: leader %q token %q; want i-0a %s kept", l, tok, tok1)
	}
	if n := w.leaderWrites(); n != before {
		t.Errorf("scale-out wrote the leader tag %d times; want none (no flap)", n-before)
	}

	// The leader enters Terminating:Wait (a lifecycle hook): the tag moves.
	w.fake.Set("i-0a", func(in *awsfake.Instance) { in.Lifecycle = "Terminating:Wait" })
	invoke(t, fn, eventBridge("EC2 Instance-terminate Lifecycle Action", "i-0a"))
	l, tok2 := w.leader(t, ids...)
	if l != "i-09" || tok2 <= tok1 && len(tok2) <= len(tok1) {
		t.Errorf("after the leader's Terminating:Wait: leader %q token %q; want i-09 with a token above %s", l, tok2, tok1)
	}
	w.fake.Terminate("i-0a")

	// Unhealthy leader, and the event lost: the schedule reconciles.
	w.fake.Set("i-09", func(in *awsfake.Instance) { in.Health = "Unhealthy" })
	invoke(t, fn, scheduled())
	if l, _ := w.leader(t, ids...); l != "i-0b" {
		t.Errorf("after the leader went Unhealthy (event lost, schedule): leader %q; want i-0b", l)
	}
	w.neverTwo(t)
}

// TestDuplicateAndOutOfOrderEvents: the same notification twice, and an
// old one after a newer state, write nothing more.
func TestDuplicateAndOutOfOrderEvents(t *testing.T) {
	w := newWorld(t, "i-01", "i-02")
	fn := w.function(t)
	invoke(t, fn, snsNotification("autoscaling:EC2_INSTANCE_LAUNCH", "i-02"))
	before := len(w.fake.TagWrites())
	invoke(t, fn, snsNotification("autoscaling:EC2_INSTANCE_LAUNCH", "i-02"))
	invoke(t, fn, eventBridge("EC2 Instance Launch Successful", "i-01"))
	invoke(t, fn, snsNotification("autoscaling:EC2_INSTANCE_TERMINATE", "i-03"))
	if n := len(w.fake.TagWrites()); n != before {
		t.Errorf("duplicated and stale events wrote %d tags; want none", n-before)
	}
	if l, _ := w.leader(t, "i-01", "i-02"); l != "i-01" {
		t.Errorf("leader %q; want i-01", l)
	}
	w.neverTwo(t)
}

// TestConcurrentInvocations: four execution environments (reserved
// concurrency misconfigured) invoked at once, again and again, while the
// group's instances go in and out of health: never two tagged instances.
func TestConcurrentInvocations(t *testing.T) {
	w := newWorld(t, "i-05", "i-06", "i-07", "i-08")
	fns := make([]*testserver.LambdaRIEProc, 4)
	for i := range fns {
		fns[i] = w.function(t)
	}
	ids := []string{"i-05", "i-06", "i-07", "i-08"}
	stop := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(3 * time.Millisecond):
			}
			id := ids[i%len(ids)]
			w.fake.Set(id, func(in *awsfake.Instance) {
				if in.Health == "Healthy" {
					in.Health = "Unhealthy"
				} else {
					in.Health = "Healthy"
				}
			})
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 10*len(fns))
	for _, fn := range fns {
		wg.Go(func() {
			for range 10 {
				if _, err := fn.Invoke(scheduled()); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-flipped
	close(errs)
	for err := range errs {
		t.Errorf("invocation: %v", err)
	}
	t.Logf("%d leader tag writes", w.leaderWrites())
	w.neverTwo(t)
}

// TestThrottlingAndServerErrors: throttled and failing EC2 and Auto
// Scaling calls are retried, or fail the invocation, which Lambda retries
// (as the test does); the tags end right, never two.
func TestThrottlingAndServerErrors(t *testing.T) {
	w := newWorld(t, "i-11", "i-12")
	fn := w.function(t)
	w.fake.ThrottleNext("DescribeAutoScalingGroups", 2)
	w.fake.ThrottleNext("CreateTags", 2)
	invoke(t, fn, scheduled())
	if l, _ := w.leader(t, "i-11", "i-12"); l != "i-11" {
		t.Fatalf("leader %q after throttling; want i-11", l)
	}
	w.fake.Set("i-11", func(in *awsfake.Instance) { in.Health = "Unhealthy" })
	w.fake.FailNext("DeleteTags", 10, 500, "InternalError")
	if _, err := fn.Invoke(scheduled()); err == nil || !strings.Contains(err.Error(), "InternalError") {
		t.Fatalf("invocation with DeleteTags failing: %v; want it failed, naming the error", err)
	}
	if l, _ := w.leader(t, "i-11", "i-12"); l != "i-11" {
		t.Errorf("after a failed untag: leader %q; want i-11 still (the new one is tagged only after)", l)
	}
	invoke(t, fn, scheduled()) // Lambda's retry
	if l, _ := w.leader(t, "i-11", "i-12"); l != "i-12" {
		t.Errorf("after the retry: leader %q; want i-12", l)
	}
	w.neverTwo(t)
}
