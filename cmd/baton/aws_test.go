package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// The AWS tests run the real amazon-ec2-metadata-mock as each simulated
// instance's IMDS, and the real AWS SDK (in the baton processes) against
// internal/awsfake, a Query-protocol model of Auto Scaling and EC2.

// mockInstance is the instance ID in the metadata mock's default data.
const mockInstance = "i-1234567890abcdef0"

// mockConfig is an amazon-ec2-metadata-mock configuration that makes one
// simulated instance: its ID and private IP in the metadata and in the
// identity document, in us-east-1.
func mockConfig(id, ip string) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"values": map[string]any{
			"instance-id": id, "local-ipv4": ip,
		}},
		"dynamic": map[string]any{"values": map[string]any{
			"instance-identity-document": map[string]any{
				"accountId": "123456789012", "architecture": "x86_64", "availabilityZone": "us-east-1a",
				"imageId": "ami-12345678", "instanceId": id, "instanceType": "t3.micro",
				"pendingTime": "2030-01-01T00:00:00Z", "privateIp": ip, "region": "us-east-1", "version": "2017-09-30",
			},
		}},
	}
}

// startMetadataMock runs the mock on a loopback port with IMDSv2 required,
// stopped when the test ends, and returns its endpoint URL. cfg (nil for
// the defaults) is its configuration file; args go before the global flags
// (a mode such as "spot" or "asglifecycle", and its flags).
func startMetadataMock(t *testing.T, cfg map[string]any, args ...string) string {
	t.Helper()
	return startMock(t, 0, cfg, args...).URL
}

// mockProc is one running metadata mock.
type mockProc = testserver.MetadataMockProc

// startMock starts a metadata mock on port, or on a free one if port is 0;
// cfg (nil for the defaults) is its configuration file.
func startMock(t testing.TB, port int, cfg map[string]any, args ...string) *mockProc {
	t.Helper()
	var config string
	if cfg != nil {
		b, err := json.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		config = string(b)
	}
	return testserver.StartMetadataMock(t, port, config, args...)
}

// awsEnv is the environment of a baton process on a simulated instance:
// the test's environment without BATON_* and AWS_* variables, a home with
// no AWS files, fake static credentials, the fake's endpoint for every
// service and imds as the metadata service; extra is added.
func awsEnv(t testing.TB, f *awsfake.Server, imds string, extra ...string) []string {
	var env []string
	for _, kv := range testEnv() {
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	home := t.TempDir()
	env = append(env, "HOME="+home,
		"AWS_CONFIG_FILE="+filepath.Join(home, "none"), "AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(home, "none"),
		"AWS_EC2_METADATA_SERVICE_ENDPOINT="+imds)
	if f != nil {
		env = append(env, "AWS_ACCESS_KEY_ID=AKIDBATONTEST", "AWS_SECRET_ACCESS_KEY=secret", "AWS_ENDPOINT_URL="+f.URL())
	}
	return append(env, extra...)
}

// runBatonEnv runs the baton binary to completion with env.
func runBatonEnv(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	var stdout, stderr testserver.SyncBuffer
	cmd := exec.CommandContext(t.Context(), batonBin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("baton %s: %v", strings.Join(args, " "), err)
		}
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("baton %s did not finish within %s; stderr:\n%s", strings.Join(args, " "), timeout, stderr.String())
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// TestAWSRuleIsLeader: by the group's rule, the InService, Healthy instance
// with the lowest id leads; instances that are Pending, Standby,
// Terminating or Unhealthy never do, however low their ids.
func TestAWSRuleIsLeader(t *testing.T) {
	t.Parallel()
	imds := startMetadataMock(t, nil)
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddGroup("other")
	f.Launch("i-00000000000000001", "web", "Pending", "Healthy", "10.0.0.1")
	f.Launch("i-00000000000000002", "web", "Standby", "Healthy", "10.0.0.2")
	f.Launch("i-00000000000000003", "web", "Terminating", "Healthy", "10.0.0.3")
	f.Launch("i-00000000000000004", "web", "Terminating:Wait", "Healthy", "10.0.0.4")
	f.Launch("i-00000000000000005", "web", "InService", "Unhealthy", "10.0.0.5")
	f.Launch("i-00000000000000006", "other", "InService", "Healthy", "10.0.9.6")
	f.Launch(mockInstance, "web", "InService", "Healthy", "10.0.7.10")
	f.Launch("i-fffffffffffffffff", "web", "InService", "Healthy", "10.0.0.255")
	env := awsEnv(t, f, imds) // no AWS_REGION: the identity document's

	r := runBatonEnv(t, 30*time.Second, env, "is-leader", "--backend", "aws-asg://", "--verbose")
	if r.code != exitOK {
		t.Fatalf("is-leader: exit %d, want 0; stdout %q stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if want := "leader: instance=" + mockInstance + " private_ip=10.0.7.10 (lowest InService+Healthy instance id of 2 (group web has 7 instances))\n"; r.stdout != want {
		t.Errorf("is-leader --verbose printed %q, want %q", r.stdout, want)
	}
	r = runBatonEnv(t, 30*time.Second, env, "leader", "--backend", "aws-asg://web", "--json")
	var doc ruleJSON
	if err := json.Unmarshal([]byte(r.stdout), &doc); r.code != exitOK || err != nil || doc.InstanceID == nil {
		t.Fatalf("leader --json: exit %d, %q (%v); stderr:\n%s", r.code, r.stdout, err, r.stderr)
	}
	if *doc.InstanceID != mockInstance || doc.PrivateIP != "10.0.7.10" || doc.Group != "web" || !strings.Contains(doc.Decided, "lowest InService+Healthy") {
		t.Errorf("leader --json: %s", r.stdout)
	}

	// Each of the low ones comes InService and Healthy in turn, and wins.
	f.Set("i-00000000000000005", func(in *awsfake.Instance) { in.Health = "Healthy" })
	r = runBatonEnv(t, 30*time.Second, env, "is-leader", "--backend", "aws-asg://web", "--verbose")
	if r.code != exitFailure || !strings.Contains(r.stdout, "not leader: instance=i-00000000000000005 private_ip=10.0.0.5 leads") {
		t.Errorf("is-leader with a lower InService+Healthy instance: exit %d, stdout %q, stderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runBatonEnv(t, 30*time.Second, env, "leader", "--backend", "aws-asg://web")
	if want := `instance=i-00000000000000005 private_ip=10.0.0.5 group=web decided="lowest InService+Healthy instance id of 3 (group web has 7 instances)"` + "\n"; r.code != exitOK || r.stdout != want {
		t.Errorf("leader: exit %d, stdout %q, want %q; stderr:\n%s", r.code, r.stdout, want, r.stderr)
	}
	// --id asks about another instance, without the metadata service.
	r = runBatonEnv(t, 30*time.Second, append(env, "AWS_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true"),
		"is-leader", "--backend", "aws-asg://web", "--id", "i-00000000000000005")
	if r.code != exitOK {
		t.Errorf("is-leader --id of the leader: exit %d, stderr:\n%s", r.code, r.stderr)
	}

	// Nobody qualifies: "no", never "yes".
	for _, id := range []string{"i-00000000000000005", mockInstance, "i-fffffffffffffffff"} {
		f.Set(id, func(in *awsfake.Instance) { in.Lifecycle = "Standby" })
	}
	r = runBatonEnv(t, 30*time.Second, env, "is-leader", "--backend", "aws-asg://")
	if r.code != exitFailure {
		t.Errorf("is-leader with nobody InService: exit %d, want 1; stderr:\n%s", r.code, r.stderr)
	}
	r = runBatonEnv(t, 30*time.Second, env, "leader", "--backend", "aws-asg://web", "--json")
	if want := `{"backend":"aws-asg","group":"web","instance_id":null,"decided":"no InService+Healthy instance in group web (7 instances)"}` + "\n"; r.code != exitFailure || r.stdout != want {
		t.Errorf("leader --json with nobody: exit %d, stdout %q, want %q", r.code, r.stdout, want)
	}
	if n := f.CallCount("DescribeTags"); n != 0 {
		t.Errorf("the rule read the account's tags %d times", n)
	}
}

// TestAWSRuleErrorsAreUndetermined: throttling and server errors are exit
// 3, within --timeout, and never 1 (which a script would read as "another
// instance leads").
func TestAWSRuleErrorsAreUndetermined(t *testing.T) {
	t.Parallel()
	imds := startMetadataMock(t, nil)
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch(mockInstance, "web", "InService", "Healthy", "10.0.7.10")
	env := awsEnv(t, f, imds)

	for _, tc := range []struct {
		name   string
		inject func()
	}{
		{"throttled", func() { f.ThrottleNext("DescribeAutoScalingGroups", 1000) }},
		{"EC2 throttled", func() { f.ThrottleNext("DescribeInstances", 1000) }},
		{"5xx", func() { f.FailNext("DescribeAutoScalingGroups", 1000, 500, "InternalFailure") }},
		{"EC2 503", func() { f.FailNext("DescribeInstances", 1000, 503, "Unavailable") }},
		{"own group throttled", func() { f.ThrottleNext("DescribeAutoScalingInstances", 1000) }},
	} {
		tc.inject()
		for _, cmd := range []string{"is-leader", "leader"} {
			backend := "aws-asg://web"
			if tc.name == "own group throttled" {
				backend = "aws-asg://"
			}
			start := time.Now()
			r := runBatonEnv(t, 30*time.Second, env, cmd, "--backend", backend, "--timeout", "3s")
			took := time.Since(start)
			if r.code != exitUndetermined {
				t.Errorf("%s: %s exit %d, want 3; stderr:\n%s", tc.name, cmd, r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, "AWS") {
				t.Errorf("%s: %s stderr does not say AWS failed:\n%s", tc.name, cmd, r.stderr)
			}
			// --timeout bounds the command; the slack is the process's
			// start and exit on a loaded machine.
			if took > 3*time.Second+5*time.Second {
				t.Errorf("%s: %s took %s with --timeout 3s", tc.name, cmd, took)
			}
			t.Logf("%s: %s exit %d after %s: %s", tc.name, cmd, r.code, took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
		}
		f.ThrottleNext("DescribeAutoScalingGroups", 0)
		f.ThrottleNext("DescribeInstances", 0)
		f.ThrottleNext("DescribeAutoScalingInstances", 0)
		f.FailNext("DescribeAutoScalingGroups", 0, 0, "")
		f.FailNext("DescribeInstances", 0, 0, "")
	}
	if r := runBatonEnv(t, 30*time.Second, env, "is-leader", "--backend", "aws-asg://"); r.code != exitOK {
		t.Errorf("after the failures: exit %d, want 0; stderr:\n%s", r.code, r.stderr)
	}
}

// TestAWSRuleConfigErrors: on a machine with no region and no credentials
// (and no metadata service), or asking about a group that does not exist,
// the answer is exit 2 with a message that names the fix.
func TestAWSRuleConfigErrors(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String() // nothing answers there
	l.Close()
	env := awsEnv(t, nil, closed)
	for _, cmd := range []string{"is-leader", "leader"} {
		for _, backend := range []string{"aws-asg://", "aws-asg://web"} {
			r := runBatonEnv(t, 30*time.Second, env, cmd, "--backend", backend)
			if r.code != exitUsage {
				t.Errorf("%s --backend %s without region or credentials: exit %d, want 2; stderr:\n%s", cmd, backend, r.code, r.stderr)
			}
			for _, w := range []string{"AWS_REGION", "AWS_ACCESS_KEY_ID", "instance profile"} {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("%s --backend %s: stderr does not name %s:\n%s", cmd, backend, w, r.stderr)
				}
			}
		}
	}

	imds := startMetadataMock(t, nil)
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch("i-0000000000000000a", "", "", "", "10.0.0.1")
	f.Launch(mockInstance, "", "", "", "10.0.7.10") // in no group
	env = awsEnv(t, f, imds)
	r := runBatonEnv(t, 30*time.Second, env, "leader", "--backend", "aws-asg://nope")
	if r.code != exitUsage || !strings.Contains(r.stderr, `"nope"`) || !strings.Contains(r.stderr, "AWS_REGION") {
		t.Errorf("unknown group: exit %d, want 2 naming the group and the region; stderr:\n%s", r.code, r.stderr)
	}
	r = runBatonEnv(t, 30*time.Second, env, "is-leader", "--backend", "aws-asg://")
	if r.code != exitUsage || !strings.Contains(r.stderr, "aws-asg://GROUP") {
		t.Errorf("instance in no group: exit %d, want 2 naming aws-asg://GROUP; stderr:\n%s", r.code, r.stderr)
	}
	f.FailNext("DescribeAutoScalingGroups", 1, 403, "AccessDenied")
	r = runBatonEnv(t, 30*time.Second, env, "leader", "--backend", "aws-asg://web")
	if r.code != exitUsage || !strings.Contains(r.stderr, "autoscaling:DescribeAutoScalingGroups") {
		t.Errorf("access denied: exit %d, want 2 naming the permission; stderr:\n%s", r.code, r.stderr)
	}
}

// awsInstance is one simulated instance of the hand-over tests: its
// metadata mock and its baton.
type awsInstance struct {
	id, ip string
	mock   *mockProc
	cfg    map[string]any
	baton  *batonProc
}

// awsGroup starts three simulated instances of group "web" in the fake,
// with the termination hook "drain", each with its own metadata mock (no
// notice pending) and a `baton run --backend raft:// --join aws-asg
// --aws-lifecycle-hook drain --aws-tag app:isLeader` running the test's
// child, with members on
// 127.0.NET3.1-3 (loopback; each test its own NET3) at the raft port
// that --join aws-asg implies.
// extra is added to each baton's flags.
func awsGroup(t testing.TB, f *awsfake.Server, file, net3 string, extra ...string) []*awsInstance {
	t.Helper()
	f.AddGroup("web")
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain", HeartbeatTimeout: 30 * time.Second})
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var insts []*awsInstance
	// The group has its three instances before any baton starts, as an
	// Auto Scaling group launching three does: --bootstrap-expect auto
	// reads the group's size.
	for i := range 3 {
		in := &awsInstance{id: fmt.Sprintf("i-0000000000000aa0%d", i+1), ip: fmt.Sprintf("127.0.%s.%d", net3, i+1)}
		f.Launch(in.id, "web", "InService", "Healthy", in.ip)
		insts = append(insts, in)
	}
	for i, in := range insts {
		in.cfg = mockConfig(in.id, in.ip)
		// No notice for an hour: the target lifecycle state is InService.
		in.mock = startMock(t, 0, in.cfg, "asglifecycle", "--asg-termination-delay-sec", "3600")
		name := fmt.Sprintf("m%d", i+1)
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name, "--host", in.ip); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
		args := append([]string{"run", "--backend", "raft://", "--bind", net.JoinHostPort(in.ip, strconv.Itoa(defaultRaftPort)),
			"--join", "aws-asg", "--bootstrap-expect", "auto",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"),
			"--lease", "work", "--id", in.id, "--ttl", "10s", "--grace", "2s", "--aws-lifecycle-hook", "drain", "--aws-tag", "app:isLeader",
			"--log-level", "debug"},
			extra...)
		args = append(args, "--", self)
		env := awsEnv(t, f, in.mock.URL, childEnv+"=1", childFileEnv+"="+file, "BATON_SECRET=aws-hand-over-test-secret-0123456789")
		in.baton = startBaton(t, "baton-"+in.id, env, args...)
	}
	return insts
}

// TestAWSHandOverOnTermination: the group puts the lease holder's instance
// into Terminating:Wait (and its metadata shows the target lifecycle state
// Terminated): its child stops, a standby's child starts on the graceful
// hand-over (a resign, not the TTL's expiry), and CompleteLifecycleAction
// comes after the old child stopped.
func TestAWSHandOverOnTermination(t *testing.T) {
	testAWSHandOver(t, "14", "instance terminating", func(t *testing.T, f *awsfake.Server, in *awsInstance) {
		in.mock.Stop()
		in.mock = startMock(t, in.mock.Port, in.cfg, "asglifecycle", "--asg-termination-delay-sec", "0")
		f.BeginTermination(in.id)
	})
}

// TestAWSHandOverOnSpotNotice: the same on a spot interruption notice; the
// group then terminates the instance, and the lifecycle action is
// completed once it waits for it.
func TestAWSHandOverOnSpotNotice(t *testing.T) {
	testAWSHandOver(t, "15", "spot interruption", func(t *testing.T, f *awsfake.Server, in *awsInstance) {
		in.mock.Stop()
		// The notice now, the termination (target lifecycle state
		// Terminated) a few seconds later, as the group's reaction to it.
		in.mock = startMock(t, in.mock.Port, in.cfg, "--mock-delay-sec", "0", "--rebalance-delay-sec", "3600", "--asg-termination-delay-sec", "4")
		// Auto Scaling's side starts first: on AWS both show at once, and
		// a metadata mock's delay counts from its start, which the test
		// does not see to the millisecond.
		time.AfterFunc(2*time.Second, func() { f.BeginTermination(in.id) })
	})
}

// ledAWSGroup starts a group (awsGroup) on a fresh fake and waits until
// one of its instances runs the child. It returns the fake, the events
// file, the instances, the holder's instance and the child's start.
func ledAWSGroup(t testing.TB, net3 string) (*awsfake.Server, string, []*awsInstance, *awsInstance, event) {
	t.Helper()
	f := awsfake.Start(t)
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	insts := awsGroup(t, f, file, net3)
	testkit.Eventually(t, 60*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	first := starts(readEvents(file))[0]
	for _, in := range insts {
		if in.id == first.holder {
			return f, file, insts, in, first
		}
	}
	t.Fatalf("the first child's holder %q is none of the instances", first.holder)
	return nil, "", nil, nil, event{}
}

func testAWSHandOver(t *testing.T, net3, reason string, leave func(*testing.T, *awsfake.Server, *awsInstance)) {
	t.Parallel()
	f, file, insts, old, first := ledAWSGroup(t, net3)
	testkit.Eventually(t, 30*time.Second, "the leader's tag", func() bool {
		return slices.Equal(taggedLeaders(f, insts), []string{fmt.Sprintf("%s %d", old.id, first.token)})
	})
	t.Logf("%s leads with token %d; it is leaving (%s)", old.id, first.token, reason)
	leaveAt := time.Now()
	leave(t, f, old)

	testkit.Eventually(t, 60*time.Second, "a standby's child to start", func() bool { return len(starts(readEvents(file))) >= 2 })
	evs := readEvents(file)
	second := starts(evs)[1]
	var stopped *event
	for _, e := range evs {
		if e.kind == "stop" && e.pid == first.pid {
			stopped = &e
		}
	}
	if stopped == nil {
		t.Fatalf("the leaving instance's child %d never logged its stop (SIGTERM)", first.pid)
	}
	if second.holder == old.id {
		t.Errorf("the leaving instance %s was elected again", old.id)
	}
	if second.others != 0 {
		t.Errorf("the standby's child started while %d other children ran", second.others)
	}
	if second.token <= first.token {
		t.Errorf("new token %d is not above the old %d", second.token, first.token)
	}
	// A graceful hand-over: the standby takes the lease once the old
	// holder resigns. An expiry would take the TTL (10s) after renewals
	// stopped, and the old holder renews until it resigns.
	if gap := time.Duration(second.at - stopped.at); gap >= 5*time.Second {
		t.Errorf("the standby's child started %s after the old child stopped: not a hand-over on resign (TTL 10s)", gap)
	} else {
		t.Logf("hand-over: the standby's child started %s after the old child stopped", gap.Round(time.Millisecond))
	}

	if code := old.baton.wait(t, 60*time.Second); code != 0 {
		t.Errorf("the leaving instance's baton exited %d, want 0 (as on SIGTERM)", code)
	}
	t.Logf("the leaving instance's baton exited %s after the notice", time.Since(leaveAt).Round(time.Millisecond))
	out := old.baton.out.String()
	if !strings.Contains(out, reason) {
		t.Errorf("the leaving instance's log does not give the reason %q", reason)
	}
	var completes []awsfake.LifecycleCall
	for _, c := range f.LifecycleCalls() {
		if c.Action == "CompleteLifecycleAction" {
			completes = append(completes, c)
		}
	}
	if len(completes) != 1 {
		t.Fatalf("CompleteLifecycleAction calls: %+v, want one", completes)
	}
	c := completes[0]
	if c.Error != "" || c.InstanceID != old.id || c.Hook != "drain" || c.Result != "CONTINUE" {
		t.Errorf("CompleteLifecycleAction %+v, want CONTINUE for %s and hook drain", c, old.id)
	}
	if c.At.UnixNano() <= stopped.at {
		t.Errorf("CompleteLifecycleAction at %s, before the old child stopped at %s", c.At, time.Unix(0, stopped.at))
	}
	for _, c := range f.LifecycleCalls() {
		if c.Action == "Timeout" {
			t.Errorf("the hook timed out: %+v", c)
		}
	}
	// The standby leads on, alone.
	for _, in := range insts {
		if in != old && in.id == second.holder {
			select {
			case <-in.baton.done:
				t.Errorf("the new leader's baton exited")
			default:
			}
		}
	}
	if !alive(second.pid) {
		t.Errorf("the new leader's child %d is gone", second.pid)
	}
	// Exactly one instance carries the tag: the new leader's, with its
	// token.
	want := []string{fmt.Sprintf("%s %d", second.holder, second.token)}
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("the tag on %s alone", want), func() bool {
		return slices.Equal(taggedLeaders(f, insts), want)
	})
	for _, w := range f.TagWrites() {
		t.Logf("tag write: %+v", w)
	}
}

// taggedLeaders lists "ID TOKEN" of each instance that carries the tag
// app:isLeader=true, with its token tag.
func taggedLeaders(f *awsfake.Server, insts []*awsInstance) []string {
	var tagged []string
	for _, in := range insts {
		tags := f.Tags(in.id)
		if v, ok := tags["app:isLeader"]; ok {
			tagged = append(tagged, fmt.Sprintf("%s %s", in.id, tags["app:isLeader-token"]))
			if v != "true" {
				tagged = append(tagged, "value "+v)
			}
		}
	}
	return tagged
}

// TestAWSNotInServiceDoesNotCampaign: an instance in Standby runs baton
// but does not campaign; once Auto Scaling reports it InService it does.
func TestAWSNotInServiceDoesNotCampaign(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	id := "i-0000000000000bb01"
	f.Launch(id, "web", "Standby", "Healthy", "127.0.17.1")
	mock := startMock(t, 0, mockConfig(id, "127.0.17.1"), "asglifecycle", "--asg-termination-delay-sec", "3600")
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := awsEnv(t, f, mock.URL, childEnv+"=1", childFileEnv+"="+file)
	httpAddr := freePort(t)
	p := startBaton(t, "baton", env, "run", "--backend", "memory://", "--lease", "work", "--id", id, "--aws", "--http", httpAddr,
		"--log-level", "debug", "--", self)
	testkit.Eventually(t, 30*time.Second, "baton to say it does not campaign", func() bool {
		return strings.Contains(p.out.String(), "instance not InService: not campaigning")
	})
	if n := len(starts(readEvents(file))); n != 0 {
		t.Fatalf("%d children started on an instance in Standby", n)
	}
	if _, m := agentCall(t, http.MethodGet, "http://"+httpAddr+"/metrics", ""); !strings.Contains(m, "baton_aws_in_service 0") {
		t.Errorf("metrics lack baton_aws_in_service 0 in Standby:\n%s", m)
	}
	f.Set(id, func(in *awsfake.Instance) { in.Lifecycle = "InService" })
	testkit.Eventually(t, 60*time.Second, "the child once InService", func() bool { return len(starts(readEvents(file))) == 1 })
	if _, m := agentCall(t, http.MethodGet, "http://"+httpAddr+"/metrics", ""); !strings.Contains(m, "baton_aws_in_service 1") {
		t.Errorf("metrics lack baton_aws_in_service 1 once InService:\n%s", m)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Errorf("baton exited %d after SIGTERM", code)
	}
	if n := len(f.LifecycleCalls()); n != 0 {
		t.Errorf("%d lifecycle calls on a SIGTERM without a notice", n)
	}
}

// TestAWSAgentLeaves: `baton agent --aws-lifecycle-hook` leaves the raft
// group as on SIGTERM when its instance is terminated, says why, and
// completes the lifecycle action; its metrics show the instance InService
// until then.
func TestAWSAgentLeaves(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", awsfake.LifecycleHook{Name: "drain", HeartbeatTimeout: 30 * time.Second})
	id, ip := "i-0000000000000cc01", "127.0.18.1"
	f.Launch(id, "web", "InService", "Healthy", ip)
	cfg := mockConfig(id, ip)
	mock := startMock(t, 0, cfg, "asglifecycle", "--asg-termination-delay-sec", "3600")
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", "a1", "--host", ip); r.code != 0 {
		t.Fatalf("tls cert: %d %s", r.code, r.stderr)
	}
	httpAddr := freePort(t)
	env := awsEnv(t, f, mock.URL, "BATON_SECRET=agent-aws-test-secret-0123456789")
	agent := startBaton(t, "agent", env, "agent",
		"--bind", net.JoinHostPort(ip, strconv.Itoa(defaultRaftPort)), "--join", "aws-asg", "--bootstrap-expect", "1", "--voters", "1",
		"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "a1.pem"), "--tls-key", filepath.Join(dir, "a1-key.pem"),
		"--http", httpAddr, "--http-token-file", filepath.Join(dir, "token"), "--aws-lifecycle-hook", "drain", "--log-level", "debug")
	testkit.Eventually(t, 30*time.Second, "the agent serving", func() bool { return agentServing(httpAddr) })
	_, metrics := agentCall(t, http.MethodGet, "http://"+httpAddr+"/metrics", "")
	if !strings.Contains(metrics, "baton_aws_in_service 1") {
		t.Errorf("metrics lack baton_aws_in_service 1:\n%s", metrics)
	}

	mock.Stop()
	startMock(t, mock.Port, cfg, "asglifecycle", "--asg-termination-delay-sec", "0")
	f.BeginTermination(id)
	if code := agent.wait(t, 60*time.Second); code != 0 {
		t.Errorf("agent exited %d on the termination, want 0", code)
	}
	out := agent.out.String()
	for _, w := range []string{"instance terminating", "agent stopped"} {
		if !strings.Contains(out, w) {
			t.Errorf("agent's log lacks %q", w)
		}
	}
	var completed bool
	for _, c := range f.LifecycleCalls() {
		if c.Action == "CompleteLifecycleAction" && c.Error == "" && c.InstanceID == id && c.Result == "CONTINUE" {
			completed = true
		}
	}
	if !completed {
		t.Errorf("no CompleteLifecycleAction for %s: %+v", id, f.LifecycleCalls())
	}
}

// awsGroupView is a raft member's GET /v1/group.
type awsGroupView struct {
	ID      string   `json:"id"`
	Leader  string   `json:"leader"`
	Voters  []string `json:"voters"`
	Members []string `json:"members"`
}

func groupView(httpAddr string) (awsGroupView, bool) {
	var g awsGroupView
	r := getHTTP("GET", httpAddr, "/v1/group")
	if r.err != nil || r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &g) != nil {
		return g, false
	}
	return g, g.Leader != ""
}

// TestAWSReplaceAllThree: the group's three instances are replaced one by
// one, each old one killed (kill -9: no graceful leave) and terminated by
// the group soon after its replacement joined, faster than autopilot's
// dead-server timeout (10s); the raft leader follows the group
// (--join aws-asg gives it the group's departures), so the voters are
// always the live members, the group keeps its quorum, and the lease ends
// with a new instance.
func TestAWSReplaceAllThree(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	file := filepath.Join(t.TempDir(), "events")
	killLeftoverChildren(t, file)
	dir := t.TempDir()
	if r := runBaton(t, 30*time.Second, "tls", "ca", "--dir", filepath.Join(dir, "ca")); r.code != 0 {
		t.Fatalf("tls ca: %d %s", r.code, r.stderr)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type member struct {
		in   *awsInstance
		http string
		id   string // raft member ID
	}
	start := func(i int) *member {
		in := &awsInstance{id: fmt.Sprintf("i-0000000000000dd0%d", i), ip: fmt.Sprintf("127.0.19.%d", i)}
		in.cfg = mockConfig(in.id, in.ip)
		in.mock = startMock(t, 0, in.cfg, "asglifecycle", "--asg-termination-delay-sec", "3600")
		f.Launch(in.id, "web", "InService", "Healthy", in.ip)
		name := fmt.Sprintf("m%d", i)
		if r := runBaton(t, 30*time.Second, "tls", "cert", "--ca-dir", filepath.Join(dir, "ca"), "--dir", dir, "--name", name, "--host", in.ip); r.code != 0 {
			t.Fatalf("tls cert: %d %s", r.code, r.stderr)
		}
		m := &member{in: in, http: freePort(t)}
		env := awsEnv(t, f, in.mock.URL, childEnv+"=1", childFileEnv+"="+file, "BATON_SECRET=aws-replace-test-secret-0123456789")
		in.baton = startBaton(t, "baton-"+in.id, env, "run", "--backend", "raft://", "--bind", net.JoinHostPort(in.ip, strconv.Itoa(defaultRaftPort)),
			"--join", "aws-asg", "--bootstrap-expect", "auto",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"),
			"--lease", "work", "--id", in.id, "--http", m.http, "--log-level", "debug", "--", self)
		return m
	}
	var old []*member
	for i := 1; i <= 3; i++ {
		old = append(old, start(i))
	}
	testkit.Eventually(t, 60*time.Second, "a child to start", func() bool { return len(starts(readEvents(file))) >= 1 })
	for _, m := range old {
		testkit.Eventually(t, 30*time.Second, m.in.id+" in the group", func() bool {
			g, ok := groupView(m.http)
			m.id = g.ID
			return ok && slices.Contains(g.Voters, g.ID)
		})
	}

	var live []*member
	live = append(live, old...)
	for i, o := range old {
		n := start(4 + i)
		testkit.Eventually(t, 60*time.Second, n.in.id+" in the group", func() bool {
			g, ok := groupView(n.http)
			n.id = g.ID
			return ok && slices.Contains(g.Members, g.ID)
		})
		live = append(slices.DeleteFunc(live, func(m *member) bool { return m == o }), n)
		// The instance dies without leaving, and the group terminates it.
		_ = o.in.baton.cmd.Process.Kill()
		<-o.in.baton.done
		f.Terminate(o.in.id)
		killed := time.Now()
		var liveIDs []string
		for _, m := range live {
			liveIDs = append(liveIDs, m.id)
		}
		slices.Sort(liveIDs)
		testkit.Eventually(t, 60*time.Second, fmt.Sprintf("the voters to be the live members %q", liveIDs), func() bool {
			for _, m := range live {
				if g, ok := groupView(m.http); ok {
					v := slices.Sorted(slices.Values(g.Voters))
					return slices.Equal(v, liveIDs)
				}
			}
			return false
		})
		took := time.Since(killed)
		t.Logf("%s killed; the voters were the live members %s later", o.in.id, took.Round(time.Millisecond))
		// Autopilot alone removes a dead voter only after DeadServerAfter
		// (10s by default), and only then promotes its replacement: a
		// group replaced that fast would lose its quorum.
		if took >= 10*time.Second {
			t.Errorf("%s was replaced among the voters %s after it died: not before autopilot's dead-server timeout (10s), so not on the group's word", o.in.id, took.Round(time.Millisecond))
		}
	}
	// The lease lives on, with a new instance.
	testkit.Eventually(t, 60*time.Second, "a child of a new instance", func() bool {
		for _, e := range starts(readEvents(file)) {
			if strings.HasPrefix(e.holder, "i-0000000000000dd0") && e.holder >= "i-0000000000000dd04" && alive(e.pid) {
				return true
			}
		}
		return false
	})
}

// TestAWSWatchOutsideGroup: with --aws, an instance outside any Auto
// Scaling group is a usage error naming the cause; implied by --join
// aws-asg alone (a witness outside the group, say), the watch is skipped
// with a warning and the command runs.
func TestAWSWatchOutsideGroup(t *testing.T) {
	t.Parallel()
	f := awsfake.Start(t)
	f.AddGroup("web")
	id := "i-0000000000000ee01"
	f.Launch(id, "", "", "", "127.0.20.1") // in no group
	mock := startMock(t, 0, mockConfig(id, "127.0.20.1"), "asglifecycle", "--asg-termination-delay-sec", "3600")
	env := awsEnv(t, f, mock.URL)

	r := runBatonEnv(t, 60*time.Second, env, "run", "--backend", "memory://", "--lease", "x", "--aws", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "not in an Auto Scaling group") || !strings.Contains(r.stderr, "--aws") {
		t.Errorf("--aws outside a group: exit %d, want 2 naming the cause; stderr:\n%s", r.code, r.stderr)
	}
	r = runBatonEnv(t, 60*time.Second, env, "run", "--backend", "memory://", "--lease", "x", "--join", "aws-asg", "--once", "--", "true")
	if r.code != exitOK || !strings.Contains(r.stderr, "not watching this instance") {
		t.Errorf("--join aws-asg outside a group: exit %d, want 0 with a warning; stderr:\n%s", r.code, r.stderr)
	}
}
