package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/batonhq/baton/internal/awsfake"
	"github.com/batonhq/baton/internal/testserver"
)

var (
	batonOnce sync.Once
	batonCLI  string
	batonErr  error
)

// buildBaton builds the baton CLI that runs on the instances, once per
// test binary.
func buildBaton(t *testing.T) string {
	t.Helper()
	batonOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-cli-")
		if err != nil {
			batonErr = err
			return
		}
		batonCLI = filepath.Join(dir, "baton")
		cmd := exec.Command("go", "build", "-o", batonCLI, "../baton")
		if out, err := cmd.CombinedOutput(); err != nil {
			batonErr = errors.New("go build ../baton: " + err.Error() + "\n" + string(out))
		}
	})
	if batonErr != nil {
		t.Fatal(batonErr)
	}
	return batonCLI
}

// instances is the instance side of one group: the baton CLI run on each
// simulated instance, whose metadata service (the real metadata mock,
// fronted by the fake for that instance's id and tags) serves its tags.
type instances struct {
	w     *world
	baton string
	mock  string
	front map[string]string
}

func (w *world) instances(t *testing.T) *instances {
	t.Helper()
	return &instances{w: w, baton: buildBaton(t), mock: testserver.StartMetadataMock(t, 0, "").URL, front: map[string]string{}}
}

// run runs baton args on instance id and returns its exit status and
// stdout.
func (in *instances) run(t *testing.T, id string, args ...string) (int, string) {
	t.Helper()
	front, ok := in.front[id]
	if !ok {
		front = in.w.fake.IMDSFront(t, in.mock, id)
		in.front[id] = front
	}
	none := filepath.Join(t.TempDir(), "none")
	cmd := exec.CommandContext(t.Context(), in.baton, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(),
		"AWS_CONFIG_FILE=" + none, "AWS_SHARED_CREDENTIALS_FILE=" + none,
		"AWS_EC2_METADATA_SERVICE_ENDPOINT=" + front}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("baton %s on %s: %v", strings.Join(args, " "), id, err)
	}
	if code := cmd.ProcessState.ExitCode(); code > 1 {
		t.Fatalf("baton %s on %s: exit %d; stderr:\n%s", strings.Join(args, " "), id, code, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String()
}

// agree checks that at most one running instance is tagged and that on
// every running instance, baton is-leader --backend aws-tag:// answers as
// the tags do (0 on the tagged instance, 1 elsewhere), and baton leader
// names that instance and its token there; it returns the tagged
// instance. (A terminated instance keeps its tags while EC2 still lists
// it; nothing runs there to read them.)
func (in *instances) agree(t *testing.T, running []string) string {
	t.Helper()
	l, tok := in.w.leader(t, running...)
	for _, id := range running {
		code, _ := in.run(t, id, "is-leader", "--backend", "aws-tag://"+tagKey, "--timeout", "5s")
		if want := map[bool]int{true: 0, false: 1}[id == l]; code != want {
			t.Errorf("is-leader on %s: exit %d; want %d (tagged leader %q)", id, code, want, l)
		}
		if id != l {
			continue
		}
		code, out := in.run(t, id, "leader", "--backend", "aws-tag://"+tagKey, "--json", "--timeout", "5s")
		var doc struct {
			Holder *string `json:"holder"`
			Token  string  `json:"token"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 || doc.Holder == nil || *doc.Holder != id || doc.Token != tok {
			t.Errorf("leader --json on %s: exit %d, %q; want holder %s token %s", id, code, out, id, tok)
		}
	}
	return l
}

// TestEndToEnd runs every piece as AWS would: the function's bootstrap
// under the Runtime Interface Emulator, invoked with the events AWS sends
// (scheduled, SNS, EventBridge; lost, duplicated, concurrent), and on
// each simulated instance the baton CLI reading its own tags through
// IMDSv2. The instances agree with the tags at every step; tags never
// name two running instances.
func TestEndToEnd(t *testing.T) {
	w := newWorld(t, "i-0c", "i-0a", "i-0b")
	fn, fn2 := w.function(t), w.function(t)
	in := w.instances(t)
	running := []string{"i-0a", "i-0b", "i-0c"}

	invoke(t, fn, scheduled())
	if l := in.agree(t, running); l != "i-0a" {
		t.Fatalf("elected %q; want i-0a", l)
	}

	// Scale-out, its notification delivered to two execution environments
	// at once (one environment runs one invocation at a time) and then
	// again: the leader stays.
	w.fake.Launch("i-09", "web", "InService", "Healthy", "10.0.0.9")
	running = append(running, "i-09")
	var wg sync.WaitGroup
	for _, f := range []*testserver.LambdaRIEProc{fn, fn2} {
		wg.Go(func() {
			if _, err := f.Invoke(snsNotification("autoscaling:EC2_INSTANCE_LAUNCH", "i-09")); err != nil {
				t.Errorf("invoke: %v", err)
			}
		})
	}
	wg.Wait()
	invoke(t, fn, snsNotification("autoscaling:EC2_INSTANCE_LAUNCH", "i-09"))
	if l := in.agree(t, running); l != "i-0a" {
		t.Errorf("after scale-out: leader %q; want i-0a kept", l)
	}

	// The leader enters Terminating:Wait: the tag moves while it still runs.
	w.fake.Set("i-0a", func(in *awsfake.Instance) { in.Lifecycle = "Terminating:Wait" })
	invoke(t, fn2, eventBridge("EC2 Instance-terminate Lifecycle Action", "i-0a"))
	if l := in.agree(t, running); l != "i-09" {
		t.Errorf("after the leader's Terminating:Wait: leader %q; want i-09", l)
	}
	w.fake.Terminate("i-0a")
	running = slices.DeleteFunc(running, func(id string) bool { return id == "i-0a" })

	// Every tag write so far (the leader left through a lifecycle hook, the
	// tag moving before it terminated): never two tagged at once.
	w.neverTwo(t)

	// The leader terminates without a hook (its tag stays on the
	// terminated instance, as EC2 keeps it) and the event is lost; a
	// launch arrives; the schedule reconciles among the running instances.
	w.fake.Terminate("i-09")
	w.fake.Launch("i-0d", "web", "InService", "Healthy", "10.0.0.13")
	running = []string{"i-0b", "i-0c", "i-0d"}
	invoke(t, fn, scheduled())
	if l := in.agree(t, running); l != "i-0b" {
		t.Errorf("after the leader's termination (event lost, schedule): leader %q; want i-0b", l)
	}
}
