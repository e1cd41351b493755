package aws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/autoscaling"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
)

const leaderKey = "app:isLeader"

func TestParseTag(t *testing.T) {
	for _, tc := range []struct {
		in, key, value string
		bad            string // part of the error, "" for none
	}{
		{in: "app:isLeader", key: "app:isLeader", value: "true"},
		{in: "app:isLeader=yes", key: "app:isLeader", value: "yes"},
		{in: "leader=", key: "leader", value: ""},
		{in: "k=a=b", key: "k", value: "a=b"},
		{in: "k=with space/and:colon", key: "k", value: "with space/and:colon"},
		{in: "a.b,c_d:e@f+g-h", key: "a.b,c_d:e@f+g-h", value: "true"},
		{in: strings.Repeat("k", MaxTagKey), key: strings.Repeat("k", MaxTagKey), value: "true"},
		{in: "k=" + strings.Repeat("é", MaxTagValue), key: "k", value: strings.Repeat("é", MaxTagValue)},
		{in: "", bad: "key is empty"},
		{in: "=true", bad: "key is empty"},
		{in: strings.Repeat("k", MaxTagKey+1), bad: "122 characters long"},
		{in: "aws:isLeader", bad: `starts with "aws:"`},
		{in: "AWS:isLeader", bad: `starts with "aws:"`},
		{in: "app/isLeader", bad: `holds '/'`},
		{in: "is leader", bad: `holds ' '`},
		{in: "_index", bad: "cannot be served"},
		{in: "..", bad: "cannot be served"},
		{in: "k=" + strings.Repeat("v", MaxTagValue+1), bad: "257 characters long"},
		{in: "k=\xff", bad: "not valid UTF-8"},
	} {
		key, value, err := ParseTag(tc.in)
		if tc.bad != "" {
			if err == nil || !errors.Is(err, ErrInvalidTag) || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("ParseTag(%.40q) = %q, %q, %v; want ErrInvalidTag saying %q", tc.in, key, value, err, tc.bad)
			}
			continue
		}
		if err != nil || key != tc.key || value != tc.value {
			t.Errorf("ParseTag(%.40q) = %.40q, %.40q, %v; want %.40q, %.40q", tc.in, key, value, err, tc.key, tc.value)
		}
	}
}

func FuzzParseTag(f *testing.F) {
	for _, s := range []string{"app:isLeader", "a=b", "=", "aws:x", "k=\xff", "_index", "a/b=c", strings.Repeat("x", 130)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, value, err := ParseTag(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidTag) {
				t.Fatalf("ParseTag(%q) error %v does not wrap ErrInvalidTag", s, err)
			}
			return
		}
		if key == "" || utf8.RuneCountInString(key+TokenTagSuffix) > 127 || strings.HasPrefix(strings.ToLower(key), "aws:") || strings.ContainsAny(key, "/ =") {
			t.Fatalf("ParseTag(%q) accepted key %q", s, key)
		}
		if !utf8.ValidString(value) || utf8.RuneCountInString(value) > MaxTagValue {
			t.Fatalf("ParseTag(%q) accepted value %q", s, value)
		}
		if got := key + "=" + value; got != s && !(s == key && value == DefaultTagValue) {
			t.Fatalf("ParseTag(%q) = %q, %q: does not give back its input", s, key, value)
		}
	})
}

// tagClients returns EC2 and Auto Scaling clients that talk to the fake
// at endpoint (f.URL() or a front of it) and try each request once, so
// that the retries a test sees are the Tagger's.
func tagClients(endpoint string) (*ec2.Client, *autoscaling.Client) {
	cfg := sdkaws.Config{Region: "us-east-1", Credentials: testCredentials, RetryMaxAttempts: 1}
	e := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = sdkaws.String(endpoint) })
	a := autoscaling.NewFromConfig(cfg, func(o *autoscaling.Options) { o.BaseEndpoint = sdkaws.String(endpoint) })
	return e, a
}

func newTestTagger(t *testing.T, endpoint, id string) *Tagger {
	t.Helper()
	e, a := tagClients(endpoint)
	tg, err := NewTagger(TagOptions{
		Key: leaderKey, Value: "true", Group: "web", InstanceID: id, EC2: e, ASG: a,
		RetryMaxBackoff: time.Millisecond,
		Logger:          slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// webGroup starts a fake with group "web" of the given instances, all
// InService, and a group "api" with one instance, i-api.
func webGroup(t *testing.T, ids ...string) *awsfake.Server {
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddGroup("api")
	for i, id := range ids {
		f.Launch(id, "web", "InService", "Healthy", fmt.Sprintf("10.0.0.%d", i+1))
	}
	f.Launch("i-api", "api", "InService", "Healthy", "10.0.1.1")
	return f
}

// tagReader lists which instances carry key, as a DescribeTags reader
// sees them, with the value of each.
func tagReader(t *testing.T, f *awsfake.Server, key string) map[string]string {
	t.Helper()
	e, _ := tagClients(f.URL())
	got := map[string]string{}
	pages := ec2.NewDescribeTagsPaginator(e, &ec2.DescribeTagsInput{Filters: []ec2types.Filter{
		{Name: sdkaws.String("key"), Values: []string{key}},
		{Name: sdkaws.String("resource-type"), Values: []string{"instance"}},
	}})
	for pages.HasMorePages() {
		p, err := pages.NextPage(context.Background())
		if err != nil {
			t.Fatalf("DescribeTags: %v", err)
		}
		for _, d := range p.Tags {
			got[sdkaws.ToString(d.ResourceId)] = sdkaws.ToString(d.Value)
		}
	}
	return got
}

// mostTagged replays the fake's tag writes over the instances' tags before
// them (before: instance ID -> carries key) and returns the most
// instances that carried key at once, and the write after which they did.
func mostTagged(before map[string]bool, writes []awsfake.TagWrite, key string) (int, awsfake.TagWrite) {
	tagged := map[string]bool{}
	for id, on := range before {
		if on {
			tagged[id] = true
		}
	}
	most, at := len(tagged), awsfake.TagWrite{}
	for _, w := range writes {
		if w.Key != key {
			continue
		}
		if w.Action == "CreateTags" {
			tagged[w.Instance] = true
		} else {
			delete(tagged, w.Instance)
		}
		if len(tagged) > most {
			most, at = len(tagged), w
		}
	}
	return most, at
}

func wantTags(t *testing.T, f *awsfake.Server, id string, want map[string]string) {
	t.Helper()
	got := f.Tags(id)
	if len(got) != len(want) {
		t.Errorf("%s tags = %v, want %v", id, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s tags = %v, want %v", id, got, want)
			return
		}
	}
}

func TestTagMovesWithToken(t *testing.T) {
	f := webGroup(t, "i-a", "i-b", "i-c")
	a, b := newTestTagger(t, f.URL(), "i-a"), newTestTagger(t, f.URL(), "i-b")
	ctx := context.Background()

	if err := a.Elected(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-a", map[string]string{leaderKey: "true", leaderKey + "-token": "1"})
	if got := tagReader(t, f, leaderKey); len(got) != 1 || got["i-a"] != "true" {
		t.Errorf("DescribeTags reader sees %v, want i-a alone", got)
	}

	if err := b.Elected(ctx, 2); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-a", nil)
	wantTags(t, f, "i-b", map[string]string{leaderKey: "true", leaderKey + "-token": "2"})
	if got := tagReader(t, f, leaderKey+"-token"); len(got) != 1 || got["i-b"] != "2" {
		t.Errorf("DescribeTags reader sees tokens %v, want i-b's 2 alone", got)
	}

	writes := f.TagWrites()
	if n, w := mostTagged(nil, writes, leaderKey); n > 1 {
		t.Errorf("%d instances carried %s at once, after write %+v; writes: %+v", n, leaderKey, w, writes)
	}
	// i-b's own tags are the last writes, after i-a's were deleted.
	var order []string
	for _, w := range writes {
		order = append(order, w.Action+" "+w.Instance+" "+w.Key)
	}
	want := []string{
		"CreateTags i-a " + leaderKey, "CreateTags i-a " + leaderKey + "-token",
		"DeleteTags i-a " + leaderKey, "DeleteTags i-a " + leaderKey + "-token",
		"CreateTags i-b " + leaderKey, "CreateTags i-b " + leaderKey + "-token",
	}
	if !slices.Equal(order, want) {
		t.Errorf("tag writes:\n%s\nwant:\n%s", strings.Join(order, "\n"), strings.Join(want, "\n"))
	}
	// Only the group's instances were touched: one DescribeAutoScalingGroups
	// and one DeleteTags per election, no account-wide reads.
	if n := f.CallCount("DescribeTags"); n != 2 {
		t.Errorf("DescribeTags called %d times, want only the test reader's 2", n)
	}
	if n := f.CallCount("DeleteTags"); n != 2 {
		t.Errorf("DeleteTags called %d times over two elections, want 2", n)
	}
}

func TestTagRemovesStaleTag(t *testing.T) {
	f := webGroup(t, "i-a", "i-b", "i-c", "i-d")
	// i-c's leader died without resigning; i-d is being terminated and
	// still carries a token; i-api, in another group, carries the same
	// key for its own group's leader.
	f.Set("i-c", func(in *awsfake.Instance) {
		in.Tags = map[string]string{leaderKey: "true", leaderKey + "-token": "7", "Name": "c"}
	})
	f.Set("i-d", func(in *awsfake.Instance) {
		in.Lifecycle = "Terminating:Wait"
		in.Tags = map[string]string{leaderKey + "-token": "6"}
	})
	f.Set("i-api", func(in *awsfake.Instance) { in.Tags = map[string]string{leaderKey: "true"} })

	b := newTestTagger(t, f.URL(), "i-b")
	if err := b.Elected(context.Background(), 8); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-c", map[string]string{"Name": "c"})
	wantTags(t, f, "i-d", nil)
	wantTags(t, f, "i-b", map[string]string{leaderKey: "true", leaderKey + "-token": "8"})
	wantTags(t, f, "i-api", map[string]string{leaderKey: "true"})
	before := map[string]bool{"i-c": true}
	if n, w := mostTagged(before, f.TagWrites(), leaderKey); n > 1 {
		t.Errorf("%d instances of web carried %s at once, after write %+v", n, leaderKey, w)
	}
}

// TestTagNeverTwoWhileReadsLag elects i-b while i-a's tag, written a
// moment earlier, does not show in reads yet. A tagger that deleted only
// the tags it could read would leave i-a tagged once the writes
// propagate.
func TestTagNeverTwoWhileReadsLag(t *testing.T) {
	f := webGroup(t, "i-a", "i-b", "i-c")
	f.SetTagDelay(time.Hour)
	a, b := newTestTagger(t, f.URL(), "i-a"), newTestTagger(t, f.URL(), "i-b")
	ctx := context.Background()
	if err := a.Elected(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := tagReader(t, f, leaderKey); len(got) != 0 {
		t.Fatalf("a reader sees %v before the write propagated", got)
	}
	if err := b.Elected(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if got := tagReader(t, f, leaderKey); len(got) != 0 {
		t.Fatalf("a reader sees %v before the writes propagated", got)
	}
	f.PropagateTags()
	if got := tagReader(t, f, leaderKey); len(got) != 1 || got["i-b"] != "true" {
		t.Errorf("after propagation a reader sees %v, want i-b alone", got)
	}
	if n, w := mostTagged(nil, f.TagWrites(), leaderKey); n > 1 {
		t.Errorf("%d instances carried %s at once, after write %+v", n, leaderKey, w)
	}

	// A short delay passes by itself.
	f.SetTagDelay(50 * time.Millisecond)
	if err := a.Elected(ctx, 3); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the reader to see i-a alone with token 3", func() bool {
		got := tagReader(t, f, leaderKey+"-token")
		return len(got) == 1 && got["i-a"] == "3"
	})
}

// ec2Front is an HTTP front of the fake that may answer a request itself
// with an EC2 error, as fault decides from the request's form; the rest
// reach the fake unchanged (their signature still holds).
func ec2Front(t *testing.T, f *awsfake.Server, fault func(form url.Values) (status int, code string)) string {
	target, _ := url.Parse(f.URL())
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		form, _ := url.ParseQuery(string(body))
		if status, code := fault(form); status != 0 {
			w.Header().Set("Content-Type", "text/xml")
			w.WriteHeader(status)
			fmt.Fprintf(w, "<Response><Errors><Error><Code>%s</Code><Message>injected</Message></Error></Errors><RequestID>req-front</RequestID></Response>", code)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestTagRetriesThrottlingAnd5xx(t *testing.T) {
	f := webGroup(t, "i-a", "i-b")
	f.Set("i-a", func(in *awsfake.Instance) { in.Tags = map[string]string{leaderKey: "true"} })
	f.ThrottleNext("DescribeAutoScalingGroups", 3)
	f.ThrottleNext("DeleteTags", 4)
	var mu sync.Mutex
	failed := 0
	front := ec2Front(t, f, func(form url.Values) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if form.Get("Action") == "CreateTags" && failed < 3 {
			failed++
			return http.StatusInternalServerError, "InternalError"
		}
		return 0, ""
	})
	b := newTestTagger(t, front, "i-b")
	if err := b.Elected(context.Background(), 5); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-a", nil)
	wantTags(t, f, "i-b", map[string]string{leaderKey: "true", leaderKey + "-token": "5"})
	for action, want := range map[string]int{"DescribeAutoScalingGroups": 4, "DeleteTags": 5, "CreateTags": 1} {
		if n := f.CallCount(action); n != want {
			t.Errorf("%s reached the fake %d times, want %d", action, n, want)
		}
	}
	if failed != 3 {
		t.Errorf("the front failed %d CreateTags, want 3", failed)
	}
}

func TestTagStopsOnRefusedDelete(t *testing.T) {
	f := webGroup(t, "i-a", "i-b")
	f.Set("i-a", func(in *awsfake.Instance) { in.Tags = map[string]string{leaderKey: "true"} })
	front := ec2Front(t, f, func(form url.Values) (int, string) {
		if form.Get("Action") == "DeleteTags" {
			return http.StatusForbidden, "UnauthorizedOperation"
		}
		return 0, ""
	})
	b := newTestTagger(t, front, "i-b")
	err := b.Elected(context.Background(), 5)
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "UnauthorizedOperation" {
		t.Fatalf("Elected = %v, want the UnauthorizedOperation", err)
	}
	t.Logf("error: %v", err)
	if n := f.CallCount("CreateTags"); n != 0 {
		t.Errorf("CreateTags called %d times after the delete failed", n)
	}
	wantTags(t, f, "i-b", nil)
}

func TestTagNotAfterTermEnds(t *testing.T) {
	f := webGroup(t, "i-a", "i-b")
	f.Set("i-a", func(in *awsfake.Instance) { in.Tags = map[string]string{leaderKey: "true"} })
	b := newTestTagger(t, f.URL(), "i-b")

	arrived, release := f.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Elected(ctx, 5) }()
	<-arrived // the group's listing is under way
	cancel()  // the term ends
	release()
	err := <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Elected = %v, want an error wrapping context.Canceled", err)
	}
	t.Logf("error: %v", err)
	if n := f.CallCount("CreateTags"); n != 0 {
		t.Errorf("CreateTags called %d times after the term ended", n)
	}
	wantTags(t, f, "i-b", nil)
}

func TestTagDemoted(t *testing.T) {
	f := webGroup(t, "i-a", "i-b")
	f.Set("i-a", func(in *awsfake.Instance) { in.Tags = map[string]string{"Name": "a"} })
	a := newTestTagger(t, f.URL(), "i-a")
	ctx := context.Background()
	if err := a.Elected(ctx, 1); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-a", map[string]string{"Name": "a", leaderKey: "true", leaderKey + "-token": "1"})
	f.ThrottleNext("DeleteTags", 2)
	if err := a.Demoted(ctx); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-a", map[string]string{"Name": "a"})
	if got := tagReader(t, f, leaderKey); len(got) != 0 {
		t.Errorf("after Demoted a reader sees %v", got)
	}
	// Demoted again, with nothing left to remove, succeeds.
	if err := a.Demoted(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTagSkipsPurgedInstance lists in the group an instance that EC2 no
// longer knows: EC2 fails a DeleteTags naming it, and the Tagger deletes
// from the others one by one.
func TestTagSkipsPurgedInstance(t *testing.T) {
	f := webGroup(t, "i-a", "i-b", "i-gone")
	f.Set("i-a", func(in *awsfake.Instance) { in.Tags = map[string]string{leaderKey: "true"} })
	front := ec2Front(t, f, func(form url.Values) (int, string) {
		if form.Get("Action") == "DeleteTags" && slices.Contains(listValues(form, "ResourceId"), "i-gone") {
			return http.StatusBadRequest, "InvalidInstanceID.NotFound"
		}
		return 0, ""
	})
	b := newTestTagger(t, front, "i-b")
	if err := b.Elected(context.Background(), 2); err != nil {
		t.Fatal(err)
	}
	wantTags(t, f, "i-a", nil)
	wantTags(t, f, "i-b", map[string]string{leaderKey: "true", leaderKey + "-token": "2"})
}

func listValues(form url.Values, prefix string) []string {
	var vs []string
	for i := 1; form.Has(fmt.Sprintf("%s.%d", prefix, i)); i++ {
		vs = append(vs, form.Get(fmt.Sprintf("%s.%d", prefix, i)))
	}
	return vs
}

func TestNewTaggerOptions(t *testing.T) {
	_, err := NewTagger(TagOptions{Key: "aws:x", RetryMaxBackoff: -1, EC2: onlyDescribe{}})
	var oe *OptionsError
	if !errors.As(err, &oe) {
		t.Fatalf("NewTagger = %v, want *OptionsError", err)
	}
	for _, want := range []string{"aws: leader tag: invalid options: Key:", "InstanceID is empty", "has no CreateTags", "ASG is nil", "RetryMaxBackoff"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if len(oe.Problems) != 5 {
		t.Errorf("%d problems, want 5: %q", len(oe.Problems), oe.Problems)
	}
}

// onlyDescribe is an EC2API without the tag calls.
type onlyDescribe struct{}

func (onlyDescribe) DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	return nil, errors.New("not used")
}

// TestTagFindsOwnGroup leaves Group empty: the Tagger asks Auto Scaling
// once, then keeps the answer.
func TestTagFindsOwnGroup(t *testing.T) {
	f := webGroup(t, "i-a", "i-b")
	f.Set("i-a", func(in *awsfake.Instance) { in.Tags = map[string]string{leaderKey: "true"} })
	e, a := tagClients(f.URL())
	b, err := NewTagger(TagOptions{Key: leaderKey, Value: "on", InstanceID: "i-b", EC2: e, ASG: a, RetryMaxBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for token := range uint64(2) {
		if err := b.Elected(context.Background(), token+1); err != nil {
			t.Fatal(err)
		}
	}
	wantTags(t, f, "i-a", nil)
	wantTags(t, f, "i-b", map[string]string{leaderKey: "on", leaderKey + "-token": "2"})
	if n := f.CallCount("DescribeAutoScalingInstances"); n != 1 {
		t.Errorf("DescribeAutoScalingInstances called %d times, want 1", n)
	}
}

// TestFakeTags checks the fake's tag calls against the SDK: filters,
// pagination, conditional deletes and EC2's refusals.
func TestFakeTags(t *testing.T) {
	f := webGroup(t, "i-a", "i-b", "i-c")
	e, _ := tagClients(f.URL())
	ctx := context.Background()
	if _, err := e.CreateTags(ctx, &ec2.CreateTagsInput{
		Resources: []string{"i-a", "i-b", "i-c"},
		Tags: []ec2types.Tag{
			{Key: sdkaws.String("k1"), Value: sdkaws.String("v")}, {Key: sdkaws.String("k2"), Value: sdkaws.String("v")},
			{Key: sdkaws.String("k3"), Value: sdkaws.String("")},
		},
	}); err != nil {
		t.Fatal(err)
	}
	// Nine tags in pages of at most 5.
	var got []string
	pages := ec2.NewDescribeTagsPaginator(e, &ec2.DescribeTagsInput{MaxResults: sdkaws.Int32(5)})
	for pages.HasMorePages() {
		p, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Tags) > 5 {
			t.Errorf("a page of %d tags, want at most 5", len(p.Tags))
		}
		for _, d := range p.Tags {
			if d.ResourceType != ec2types.ResourceTypeInstance {
				t.Errorf("resource type %q", d.ResourceType)
			}
			got = append(got, sdkaws.ToString(d.ResourceId)+"/"+sdkaws.ToString(d.Key))
		}
	}
	if len(got) != 9 {
		t.Errorf("DescribeTags listed %q, want 9 tags", got)
	}
	// Filters: one filter's values are alternatives, filters combine.
	out, err := e.DescribeTags(ctx, &ec2.DescribeTagsInput{Filters: []ec2types.Filter{
		{Name: sdkaws.String("key"), Values: []string{"k1", "k3"}},
		{Name: sdkaws.String("resource-id"), Values: []string{"i-b"}},
	}})
	if err != nil || len(out.Tags) != 2 {
		t.Errorf("filtered DescribeTags = %d tags, %v; want i-b's k1 and k3", len(out.Tags), err)
	}
	if _, err := e.DescribeTags(ctx, &ec2.DescribeTagsInput{Filters: []ec2types.Filter{{Name: sdkaws.String("colour"), Values: []string{"x"}}}}); !apiCode(err, "InvalidParameterValue") {
		t.Errorf("DescribeTags with an unknown filter: %v", err)
	}

	// A value given to DeleteTags must match; an empty one matches only an
	// empty value; a key alone deletes whatever the value.
	del := func(tags ...ec2types.Tag) {
		t.Helper()
		if _, err := e.DeleteTags(ctx, &ec2.DeleteTagsInput{Resources: []string{"i-a"}, Tags: tags}); err != nil {
			t.Fatal(err)
		}
	}
	del(ec2types.Tag{Key: sdkaws.String("k1"), Value: sdkaws.String("other")}, ec2types.Tag{Key: sdkaws.String("k2"), Value: sdkaws.String("")})
	wantTags(t, f, "i-a", map[string]string{"k1": "v", "k2": "v", "k3": ""})
	del(ec2types.Tag{Key: sdkaws.String("k3"), Value: sdkaws.String("")}, ec2types.Tag{Key: sdkaws.String("k1")})
	wantTags(t, f, "i-a", map[string]string{"k2": "v"})

	// EC2's refusals.
	for _, tc := range []struct {
		in   *ec2.CreateTagsInput
		code string
	}{
		{&ec2.CreateTagsInput{Resources: []string{"i-a"}, Tags: []ec2types.Tag{{Key: sdkaws.String("aws:x"), Value: sdkaws.String("v")}}}, "InvalidParameterValue"},
		{&ec2.CreateTagsInput{Resources: []string{"i-a"}, Tags: []ec2types.Tag{{Key: sdkaws.String(strings.Repeat("k", 128)), Value: sdkaws.String("v")}}}, "InvalidParameterValue"},
		{&ec2.CreateTagsInput{Resources: []string{"i-a"}, Tags: []ec2types.Tag{{Key: sdkaws.String("k"), Value: sdkaws.String(strings.Repeat("v", 257))}}}, "InvalidParameterValue"},
		{&ec2.CreateTagsInput{Resources: []string{"i-a", "i-nope"}, Tags: []ec2types.Tag{{Key: sdkaws.String("k"), Value: sdkaws.String("v")}}}, "InvalidInstanceID.NotFound"},
	} {
		if _, err := e.CreateTags(ctx, tc.in); !apiCode(err, tc.code) {
			t.Errorf("CreateTags %v: %v, want %s", tc.in.Resources, err, tc.code)
		}
	}
	wantTags(t, f, "i-a", map[string]string{"k2": "v"}) // a refused request changed nothing
}

func apiCode(err error, code string) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == code
}

// TestTagIMDSFront reads the tag as a program on the instance does, from
// the instance metadata with the SDK's IMDSv2 client, through the fake's
// front of the real metadata mock.
func TestTagIMDSFront(t *testing.T) {
	mock, _ := startMetadataMock(t)
	id := metadataMockInstance
	f := webGroup(t, id, "i-b")
	front := f.IMDSFront(t, mock, id)
	client := imds.New(imds.Options{Endpoint: front, EnableFallback: sdkaws.FalseTernary})
	ctx := context.Background()

	read := func(path string) (string, int) {
		t.Helper()
		out, err := client.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			var re *smithyhttp.ResponseError
			if errors.As(err, &re) {
				return "", re.HTTPStatusCode()
			}
			t.Fatalf("GetMetadata %s: %v", path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			t.Fatal(err)
		}
		return string(b), http.StatusOK
	}

	// Other paths, and the token handshake, are the mock's.
	if got, _ := read("instance-id"); got != id {
		t.Fatalf("instance-id through the front = %q, want the mock's %q", got, id)
	}
	if _, status := read("tags/instance/" + leaderKey); status != http.StatusNotFound {
		t.Errorf("before the election the tag reads with status %d, want 404", status)
	}

	f.SetTagDelay(time.Hour)
	tg := newTestTagger(t, f.URL(), id)
	if err := tg.Elected(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, status := read("tags/instance/" + leaderKey); status != http.StatusNotFound {
		t.Errorf("before the write propagated the tag reads with status %d, want 404", status)
	}
	f.PropagateTags()
	if got, _ := read("tags/instance/" + leaderKey); got != "true" {
		t.Errorf("tag = %q, want true", got)
	}
	if got, _ := read("tags/instance/" + leaderKey + "-token"); got != "3" {
		t.Errorf("token tag = %q, want 3", got)
	}
	if got, _ := read("tags/instance"); got != leaderKey+"\n"+leaderKey+"-token" {
		t.Errorf("tags/instance = %q, want both keys, a line each", got)
	}

	// IMDSv2 holds on the tags paths: no token, no answer.
	resp, err := http.Get(front + "/latest/meta-data/tags/instance/" + leaderKey)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a tag read without a session token got %d, want 401", resp.StatusCode)
	}

	f.SetTagDelay(50 * time.Millisecond)
	if err := tg.Demoted(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the tag to go from the instance metadata", func() bool {
		_, status := read("tags/instance/" + leaderKey)
		return status == http.StatusNotFound
	})
}

// TestTagDemotedWaitsForElected ends a term while its Elected is still
// listing the group: Demoted runs only once that Elected has returned, so
// no write of the ended term lands after Demoted's delete.
func TestTagDemotedWaitsForElected(t *testing.T) {
	f := webGroup(t, "i-a", "i-b")
	a := newTestTagger(t, f.URL(), "i-a")

	arrived, release := f.Hold()
	ctx, cancel := context.WithCancel(context.Background())
	elected := make(chan error, 1)
	go func() { elected <- a.Elected(ctx, 1) }()
	<-arrived // Elected's listing of the group is held
	demoted := make(chan error, 1)
	go func() { demoted <- a.Demoted(context.Background()) }()
	cancel()
	release()
	if err := <-elected; !errors.Is(err, context.Canceled) {
		t.Fatalf("Elected = %v, want an error wrapping context.Canceled", err)
	}
	if err := <-demoted; err != nil {
		t.Fatal(err)
	}
	writes := f.TagWrites()
	if len(writes) != 0 {
		t.Errorf("tag writes %+v, want none: the term ended before Elected tagged", writes)
	}
	if n := f.CallCount("CreateTags"); n != 0 {
		t.Errorf("CreateTags called %d times", n)
	}
	if n := f.CallCount("DeleteTags"); n != 1 {
		t.Errorf("DeleteTags called %d times, want Demoted's 1", n)
	}
}

func TestTagBackoff(t *testing.T) {
	for _, max := range []time.Duration{time.Millisecond, DefaultTagMaxBackoff, time.Hour} {
		prev := time.Duration(0)
		for attempt := 1; attempt <= 200; attempt++ {
			lo, hi := tagBackoff(attempt, max, 0), tagBackoff(attempt, max, 0.999)
			if lo <= 0 || hi > max || lo > hi {
				t.Fatalf("max %s attempt %d: wait in [%s, %s], want within (0, %s]", max, attempt, lo, hi, max)
			}
			if hi < prev {
				t.Fatalf("max %s attempt %d: the wait shrank from %s to %s", max, attempt, prev, hi)
			}
			prev = hi
		}
		if got := tagBackoff(200, max, 0.999); got < max/2 {
			t.Errorf("max %s: the wait after 200 attempts is %s, want near the cap", max, got)
		}
	}
	if got := tagBackoff(1, DefaultTagMaxBackoff, 0); got != tagFirstBackoff/2 {
		t.Errorf("first wait at least %s, want %s", got, tagFirstBackoff/2)
	}
}

// TestTagTermsInTurn runs many terms in turn, as a lease hands them out,
// on three instances, under throttling and propagation delay, some cut
// short at a random moment (then Demoted, as the caller must). In the
// order EC2 accepted the writes, no two instances ever carry the tag, and
// at the end the last leader alone does, or none if it was demoted.
func TestTagTermsInTurn(t *testing.T) {
	ids := []string{"i-a", "i-b", "i-c"}
	f := webGroup(t, ids...)
	f.SetTagDelay(20 * time.Millisecond)
	taggers := map[string]*Tagger{}
	for _, id := range ids {
		taggers[id] = newTestTagger(t, f.URL(), id)
	}
	rnd := rand.New(rand.NewPCG(14, 14))
	last, cutShort := "", 0
	for token := uint64(1); token <= 30; token++ {
		id := ids[rnd.IntN(len(ids))]
		if rnd.IntN(3) == 0 {
			f.ThrottleNext([]string{"DescribeAutoScalingGroups", "DeleteTags", "CreateTags"}[rnd.IntN(3)], 1+rnd.IntN(3))
		}
		ctx, cancel := context.WithCancel(context.Background())
		cut := rnd.IntN(4) == 0
		if cut {
			time.AfterFunc(time.Duration(rnd.IntN(3000))*time.Microsecond, cancel)
		}
		err := taggers[id].Elected(ctx, token)
		cancel()
		if err != nil && !cut {
			t.Fatalf("term %d on %s: %v", token, id, err)
		}
		if err != nil {
			cutShort++
		}
		if err != nil || rnd.IntN(4) == 0 {
			if err := taggers[id].Demoted(context.Background()); err != nil {
				t.Fatalf("term %d on %s: Demoted: %v", token, id, err)
			}
			last = ""
			continue
		}
		last = id
		if n, w := mostTagged(nil, f.TagWrites(), leaderKey); n > 1 {
			t.Fatalf("after term %d: %d instances carried %s at once, after write %+v", token, n, leaderKey, w)
		}
	}
	if n, w := mostTagged(nil, f.TagWrites(), leaderKey); n > 1 {
		t.Fatalf("%d instances carried %s at once, after write %+v", n, leaderKey, w)
	}
	t.Logf("%d terms cut short, %d tag writes", cutShort, len(f.TagWrites()))
	f.PropagateTags()
	got := tagReader(t, f, leaderKey)
	if last == "" && len(got) != 0 || last != "" && (len(got) != 1 || got[last] != "true") {
		t.Errorf("a reader sees %v, want %q alone (none after a demotion)", got, last)
	}
}
