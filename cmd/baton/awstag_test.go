package main

import (
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
)

// TestAWSTagIsLeader: is-leader --backend aws-tag://KEY on each simulated
// instance (its own metadata service with instance tags) agrees with the
// tags that baton-lambda writes: 0 on the tagged instance, 1 elsewhere,
// 1 for another value, 3 when the metadata cannot be read, 2 for a bad URL.
func TestAWSTagIsLeader(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0000000000000000a", "web", "InService", "Healthy", "10.0.0.1")
	f.Launch("i-0000000000000000b", "web", "InService", "Healthy", "10.0.0.2")
	f.Set("i-0000000000000000a", func(in *awsfake.Instance) {
		in.Tags = map[string]string{"app:isLeader": "true", "app:isLeader-token": "42"}
	})
	mock := startMetadataMock(t, nil)
	for _, tc := range []struct {
		id, url string
		want    int
	}{
		{"i-0000000000000000a", "aws-tag://app:isLeader", 0},
		{"i-0000000000000000b", "aws-tag://app:isLeader", 1},
		{"i-0000000000000000a", "aws-tag://app:isLeader=true", 0},
		{"i-0000000000000000a", "aws-tag://app:isLeader=false", 1},
	} {
		front := f.IMDSFront(t, mock, tc.id)
		r := runBatonEnv(t, 30*time.Second, awsEnv(t, nil, front), "is-leader", "--backend", tc.url, "--timeout", "5s")
		if r.code != tc.want {
			t.Errorf("%s on %s: exit %d; want %d; stderr:\n%s", tc.url, tc.id, r.code, tc.want, r.stderr)
		}
	}
	// No metadata service: undetermined, never "not leader".
	r := runBatonEnv(t, 30*time.Second, awsEnv(t, nil, "http://127.0.0.1:1"), "is-leader", "--backend", "aws-tag://app:isLeader", "--timeout", "3s")
	if r.code != 3 {
		t.Errorf("without a metadata service: exit %d; want 3; stderr:\n%s", r.code, r.stderr)
	}
	r = runBatonEnv(t, 30*time.Second, awsEnv(t, nil, mock), "is-leader", "--backend", "aws-tag://aws:reserved")
	if r.code != 2 || !strings.Contains(r.stderr, "aws:") {
		t.Errorf("a reserved key: exit %d; want 2; stderr:\n%s", r.code, r.stderr)
	}
}

// TestAWSTagLeader: leader --backend aws-tag://KEY on each simulated
// instance says what that instance's own metadata says: on the tagged
// instance, itself as holder with the token tag; elsewhere exit 1 with a
// null holder and a message that it cannot name the leader; 3 without
// metadata; 2 for a bad URL.
func TestAWSTagLeader(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	const a, b = "i-0000000000000000a", "i-0000000000000000b"
	f.Launch(a, "web", "InService", "Healthy", "10.0.0.1")
	f.Launch(b, "web", "InService", "Healthy", "10.0.0.2")
	f.Set(a, func(in *awsfake.Instance) {
		in.Tags = map[string]string{"app:isLeader": "true", "app:isLeader-token": "42"}
	})
	mock := startMetadataMock(t, nil)
	frontA, frontB := f.IMDSFront(t, mock, a), f.IMDSFront(t, mock, b)
	leader := func(front string, args ...string) result {
		t.Helper()
		return runBatonEnv(t, 30*time.Second, awsEnv(t, nil, front), append([]string{"leader", "--timeout", "5s"}, args...)...)
	}

	r := leader(frontA, "--backend", "aws-tag://app:isLeader")
	if want := "holder=" + a + " token=42 tag=app:isLeader=true\n"; r.code != 0 || r.stdout != want {
		t.Errorf("on the tagged instance: exit %d, stdout %q; want 0, %q; stderr:\n%s", r.code, r.stdout, want, r.stderr)
	}
	r = leader(frontA, "--backend", "aws-tag://app:isLeader=true", "--json")
	if want := `{"backend":"aws-tag","tag":"app:isLeader","instance_id":"` + a + `","holder":"` + a + `","value":"true","token":"42"}` + "\n"; r.code != 0 || r.stdout != want {
		t.Errorf("--json on the tagged instance: exit %d, stdout %q; want 0, %q; stderr:\n%s", r.code, r.stdout, want, r.stderr)
	}
	r = leader(frontB, "--backend", "aws-tag://app:isLeader", "--json")
	if want := `{"backend":"aws-tag","tag":"app:isLeader","instance_id":"` + b + `","holder":null}` + "\n"; r.code != 1 || r.stdout != want || !strings.Contains(r.stderr, "cannot name") {
		t.Errorf("--json on an untagged instance: exit %d, stdout %q; want 1, %q and a stderr saying it cannot name the leader; stderr:\n%s", r.code, r.stdout, want, r.stderr)
	}
	r = leader(frontA, "--backend", "aws-tag://app:isLeader=false")
	if r.code != 1 || r.stdout != "" || !strings.Contains(r.stderr, "app:isLeader=true, not false") {
		t.Errorf("another value: exit %d, stdout %q; want 1, nothing, and the value found on stderr; stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runBatonEnv(t, 30*time.Second, awsEnv(t, nil, "http://127.0.0.1:1"), "leader", "--backend", "aws-tag://app:isLeader", "--timeout", "3s")
	if r.code != 3 {
		t.Errorf("without a metadata service: exit %d; want 3; stderr:\n%s", r.code, r.stderr)
	}
	r = leader(mock, "--backend", "aws-tag://app:isLeader/x")
	if r.code != 2 || !strings.Contains(r.stderr, "aws-tag://KEY") {
		t.Errorf("a bad URL: exit %d; want 2; stderr:\n%s", r.code, r.stderr)
	}
}
