package awsfake

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// post sends one Auto Scaling Query request as the SDK would (signature
// aside: the fake checks only that there is one).
func post(t *testing.T, f *Server, action string, params map[string]string) (int, string) {
	t.Helper()
	form := url.Values{"Action": {action}, "Version": {asgVersion}}
	for k, v := range params {
		form.Set(k, v)
	}
	req, err := http.NewRequest(http.MethodPost, f.URL(), strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDTEST/20260101/us-east-1/autoscaling/aws4_request")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func action(id, hook string) map[string]string {
	return map[string]string{"AutoScalingGroupName": "web", "LifecycleHookName": hook, "InstanceId": id, "LifecycleActionResult": "CONTINUE"}
}

func state(f *Server, id string) string {
	var s string
	f.Set(id, func(in *Instance) { s = in.Lifecycle })
	return s
}

func TestLifecycleActionNeedsPendingAction(t *testing.T) {
	f := Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", LifecycleHook{Name: "drain", HeartbeatTimeout: 300 * time.Millisecond})
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")

	for _, act := range []string{"CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"} {
		status, body := post(t, f, act, action("i-0a", "drain"))
		if status != http.StatusBadRequest || !strings.Contains(body, "<Code>ValidationError</Code>") ||
			!strings.Contains(body, "No active Lifecycle Action found with instance ID i-0a") {
			t.Errorf("%s without a pending action: %d %s; want 400 ValidationError", act, status, body)
		}
	}
	if status, body := post(t, f, "CompleteLifecycleAction", action("i-0a", "other")); status != http.StatusBadRequest || !strings.Contains(body, "No Lifecycle Hook found") {
		t.Errorf("CompleteLifecycleAction for an unknown hook: %d %s", status, body)
	}
	status, body := post(t, f, "DescribeLifecycleHooks", map[string]string{"AutoScalingGroupName": "web", "LifecycleHookNames.member.1": "drain"})
	if status != http.StatusOK || !strings.Contains(body, "<LifecycleHookName>drain</LifecycleHookName>") ||
		!strings.Contains(body, "<HeartbeatTimeout>1</HeartbeatTimeout>") || !strings.Contains(body, TransitionTerminating) {
		t.Errorf("DescribeLifecycleHooks: %d %s", status, body)
	}
	calls := f.LifecycleCalls()
	if len(calls) != 3 || calls[0].Error != "ValidationError" || calls[0].InstanceID != "i-0a" || calls[0].At.IsZero() {
		t.Errorf("recorded calls %+v, want three refused ones", calls)
	}
}

func TestLifecycleHeartbeatsKeepTheActionAlive(t *testing.T) {
	f := Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", LifecycleHook{Name: "drain", HeartbeatTimeout: time.Second, DefaultResult: "CONTINUE"})
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.BeginTermination("i-0a")
	if s := state(f, "i-0a"); s != "Terminating:Wait" {
		t.Fatalf("state %q after BeginTermination, want Terminating:Wait", s)
	}

	// Heartbeats for two and a half heartbeat timeouts keep it waiting.
	began := time.Now()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Since(began) < 2500*time.Millisecond {
		if status, body := post(t, f, "RecordLifecycleActionHeartbeat", action("i-0a", "drain")); status != http.StatusOK {
			t.Fatalf("heartbeat: %d %s", status, body)
		}
		<-tick.C
	}
	if s := state(f, "i-0a"); s != "Terminating:Wait" {
		t.Fatalf("state %q after heartbeats, want Terminating:Wait", s)
	}

	// Without them, the hook times out and its default result applies.
	testkit.Eventually(t, 10*time.Second, "the hook's timeout", func() bool { return state(f, "i-0a") == "Terminating:Proceed" })
	calls := f.LifecycleCalls()
	last := calls[len(calls)-1]
	if last.Action != "Timeout" || last.Result != "CONTINUE" || last.Hook != "drain" {
		t.Errorf("last call %+v, want the hook's timeout with CONTINUE", last)
	}
	if status, _ := post(t, f, "CompleteLifecycleAction", action("i-0a", "drain")); status != http.StatusBadRequest {
		t.Errorf("CompleteLifecycleAction after the timeout: %d, want 400", status)
	}
}

func TestLifecycleActionWaitsForEveryHook(t *testing.T) {
	f := Start(t)
	f.AddGroup("web")
	f.AddLifecycleHook("web", LifecycleHook{Name: "drain"})
	f.AddLifecycleHook("web", LifecycleHook{Name: "backup"})
	f.AddLifecycleHook("web", LifecycleHook{Name: "warm", Transition: TransitionLaunching})
	f.Launch("i-0a", "web", "InService", "Healthy", "10.0.0.1")
	f.BeginTermination("i-0a")

	if status, body := post(t, f, "CompleteLifecycleAction", action("i-0a", "warm")); status != http.StatusBadRequest {
		t.Errorf("completing the launch hook of a terminating instance: %d %s, want 400", status, body)
	}
	if status, body := post(t, f, "CompleteLifecycleAction", action("i-0a", "drain")); status != http.StatusOK {
		t.Fatalf("CompleteLifecycleAction drain: %d %s", status, body)
	}
	if s := state(f, "i-0a"); s != "Terminating:Wait" {
		t.Errorf("state %q with one hook of two completed, want Terminating:Wait", s)
	}
	if status, _ := post(t, f, "CompleteLifecycleAction", action("i-0a", "drain")); status != http.StatusBadRequest {
		t.Errorf("a second CompleteLifecycleAction for drain: %d, want 400", status)
	}
	if status, body := post(t, f, "CompleteLifecycleAction", action("i-0a", "backup")); status != http.StatusOK {
		t.Fatalf("CompleteLifecycleAction backup: %d %s", status, body)
	}
	if s := state(f, "i-0a"); s != "Terminating:Proceed" {
		t.Errorf("state %q with every hook completed, want Terminating:Proceed", s)
	}
}
