package main

import (
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
)

// dynamoEnv is the environment of a baton process that uses dynalite: the
// test's, with made-up static credentials (dynalite checks none), no AWS
// files and no instance metadata, so that nothing else is resolved.
func dynamoEnv(t *testing.T) []string {
	var env []string
	for _, kv := range testEnv() {
		if !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	none := filepath.Join(t.TempDir(), "none")
	return append(env, "AWS_ACCESS_KEY_ID=AKIDBATONTEST", "AWS_SECRET_ACCESS_KEY=secret",
		"AWS_CONFIG_FILE="+none, "AWS_SHARED_CREDENTIALS_FILE="+none, "AWS_EC2_METADATA_DISABLED=true")
}

// dynamoURL returns the dynamodb:// URL of table on d, region us-east-1.
func dynamoURL(d *testserver.DynaliteProc, table string) string {
	return "dynamodb://" + table + "?region=us-east-1&endpoint=" + url.QueryEscape(d.Endpoint)
}

// TestDynamoTableMissingThenCreated: a missing table is exit 2 naming
// `baton dynamodb create-table`, never an outage retried; create-table
// makes it (twice is fine); then the same is-leader answers.
func TestDynamoTableMissingThenCreated(t *testing.T) {
	t.Parallel()
	d := testserver.StartDynalite(t)
	env := dynamoEnv(t)
	u := dynamoURL(d, "baton-leases")
	r := runBatonEnv(t, 60*time.Second, env, "is-leader", "--backend", u, "--lease", "jobs", "--log-level", "debug")
	if r.code != 2 || !strings.Contains(r.stderr, "create-table") || strings.Contains(r.stderr, "retrying") {
		t.Fatalf("is-leader on a missing table: exit %d; want 2 naming create-table, not retried; stderr:\n%s", r.code, r.stderr)
	}
	for range 2 {
		r = runBatonEnv(t, 60*time.Second, env, "dynamodb", "create-table", "--backend", u)
		if r.code != 0 || !strings.Contains(r.stdout, "ACTIVE") {
			t.Fatalf("create-table: exit %d; stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
		}
	}
	r = runBatonEnv(t, 60*time.Second, env, "is-leader", "--backend", u, "--lease", "jobs")
	if r.code != 1 {
		t.Fatalf("is-leader on a free lease: exit %d; want 1; stderr:\n%s", r.code, r.stderr)
	}
	r = runBatonEnv(t, 60*time.Second, env, "run", "--backend", u, "--lease", "jobs", "--once", "--timeout", "30s", "--", "true")
	if r.code != 0 {
		t.Fatalf("run --once: exit %d; stderr:\n%s", r.code, r.stderr)
	}
}

// TestDynamoUsageErrors: bad dynamodb:// URLs and flags are exit 2 with a
// message naming the fix.
func TestDynamoUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"is-leader", "--backend", "dynamodb://ab", "--lease", "x"}, "3 to 255"},
		{[]string{"is-leader", "--backend", "dynamodb://t1able:8000", "--lease", "x"}, "?endpoint="},
		{[]string{"is-leader", "--backend", "dynamodb://key:secret@table", "--lease", "x"}, "credentials do not go in the URL"},
		{[]string{"is-leader", "--backend", "dynamodb://table?regoin=eu-west-1", "--lease", "x"}, `unknown parameter "regoin"`},
		{[]string{"is-leader", "--backend", "dynamodb://table?endpoint=localhost:8000", "--lease", "x"}, "http:// or https://"},
		{[]string{"is-leader", "--backend", "dynamodb://table?poll=fast", "--lease", "x"}, "positive duration"},
		{[]string{"is-leader", "--backend", "dynamodb://table", "--lease", strings.Repeat("x", 1025)}, "1024"},
		{[]string{"dynamodb", "create-table"}, "--backend is required"},
		{[]string{"dynamodb", "policy", "--table-arn", "baton-leases", "--lease", "a"}, "arn:aws:dynamodb"},
		{[]string{"dynamodb", "policy", "--table-arn", "arn:aws:dynamodb:eu-west-1:123456789012:table/t"}, "no lease names"},
	} {
		r := runBatonEnv(t, 30*time.Second, dynamoEnv(t), tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("baton %s: exit %d, stderr %q; want 2 naming %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	// No region from anywhere: exit 2 naming AWS_REGION.
	r := runBatonEnv(t, 30*time.Second, dynamoEnv(t), "is-leader", "--backend", "dynamodb://table", "--lease", "x")
	if r.code != 2 || !strings.Contains(r.stderr, "AWS_REGION") {
		t.Errorf("no region: exit %d, stderr %q; want 2 naming AWS_REGION", r.code, r.stderr)
	}
}

// TestDynamoPolicy: the printed policy is JSON that grants no DeleteItem
// and limits item access by dynamodb:LeadingKeys.
func TestDynamoPolicy(t *testing.T) {
	t.Parallel()
	r := runBatonEnv(t, 30*time.Second, dynamoEnv(t), "dynamodb", "policy",
		"--table-arn", "arn:aws:dynamodb:eu-west-1:123456789012:table/baton-leases", "--lease", "billing-*", "--lease", "reports")
	if r.code != 0 {
		t.Fatalf("policy: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	var doc struct {
		Statement []struct {
			Action    []string
			Condition map[string]map[string][]string
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("policy is not JSON: %v\n%s", err, r.stdout)
	}
	for _, s := range doc.Statement {
		for _, a := range s.Action {
			if a == "dynamodb:DeleteItem" || a == "dynamodb:*" {
				t.Errorf("the policy grants %s", a)
			}
			if a != "dynamodb:DescribeTable" && len(s.Condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]) == 0 {
				t.Errorf("%s is not limited by dynamodb:LeadingKeys", a)
			}
		}
	}
	if !strings.Contains(r.stdout, `"lease:billing-*"`) || !strings.Contains(r.stdout, `"lease:reports"`) {
		t.Errorf("policy does not name the leases:\n%s", r.stdout)
	}
}

// TestRunFailoverDynamoDB is TestRunFailover on dynalite: waiters poll.
func TestRunFailoverDynamoDB(t *testing.T) {
	t.Parallel()
	d := testserver.StartDynalite(t)
	env := dynamoEnv(t)
	u := dynamoURL(d, "baton-leases")
	if r := runBatonEnv(t, 60*time.Second, env, "dynamodb", "create-table", "--backend", u); r.code != 0 {
		t.Fatalf("create-table: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	// A renewal window of 1.1 s at 2 s, which --grace 300ms fits in.
	testRunFailover(t, u, "2s", env...)
}
