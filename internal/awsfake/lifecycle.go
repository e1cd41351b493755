package awsfake

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"slices"
	"time"
)

func init() {
	register("DescribeLifecycleHooks", false, (*Server).describeLifecycleHooks)
	register("CompleteLifecycleAction", false, (*Server).completeLifecycleAction)
	register("RecordLifecycleActionHeartbeat", false, (*Server).recordLifecycleActionHeartbeat)
}

// Lifecycle hook transitions.
const (
	TransitionTerminating = "autoscaling:EC2_INSTANCE_TERMINATING"
	TransitionLaunching   = "autoscaling:EC2_INSTANCE_LAUNCHING"
)

// Auto Scaling's defaults for a hook created without them.
const (
	defaultHeartbeatTimeout = time.Hour
	maxGlobalTimeout        = 48 * time.Hour
)

// LifecycleHook is a lifecycle hook of a group.
type LifecycleHook struct {
	Name string
	// Transition is TransitionTerminating (the default, when empty) or
	// TransitionLaunching.
	Transition string
	// HeartbeatTimeout is how long a lifecycle action waits for a
	// heartbeat or its completion before the DefaultResult applies. Zero
	// means Auto Scaling's default, one hour. Unlike AWS (30s at least),
	// the fake takes any positive duration, so that a test can see a hook
	// time out; DescribeLifecycleHooks reports it in whole seconds, rounded
	// up.
	HeartbeatTimeout time.Duration
	// DefaultResult is "CONTINUE" or "ABANDON" (the default, when empty).
	DefaultResult string
}

// globalTimeout is Auto Scaling's cap on a lifecycle action, however many
// heartbeats it gets: 100 heartbeat timeouts or 48 hours, whichever is
// smaller.
func (h *LifecycleHook) globalTimeout() time.Duration {
	return min(100*h.HeartbeatTimeout, maxGlobalTimeout)
}

// LifecycleCall is one lifecycle action request the fake answered, or the
// timeout of a lifecycle action.
type LifecycleCall struct {
	// Action is "CompleteLifecycleAction", "RecordLifecycleActionHeartbeat",
	// or "Timeout" when the hook's heartbeat timeout passed.
	Action string
	// At is when the fake handled it.
	At                      time.Time
	Group, Hook, InstanceID string
	// Result is the LifecycleActionResult asked for (or, for a timeout,
	// the hook's default result).
	Result string
	// Error is the error code answered, "" on success.
	Error string
}

// lifecycleModel is the fake's lifecycle hooks and pending lifecycle
// actions. Its maps are made on first use.
type lifecycleModel struct {
	hooks   map[string][]*LifecycleHook // by group
	actions map[string]*lifecycleAction // by instance ID
	calls   []LifecycleCall
}

// lifecycleAction is an instance waiting in Pending:Wait or
// Terminating:Wait for the group's hooks of that transition.
type lifecycleAction struct {
	group, transition string
	pending           map[string]*actionTimer // hooks not yet completed
	abandoned         bool
}

// actionTimer ends a hook's part of an action when its heartbeat timeout
// or global timeout passes.
type actionTimer struct {
	timer    *time.Timer // nil for an action the fake did not start
	due      time.Time   // when the timeout passes, unless a heartbeat comes
	deadline time.Time   // of the global timeout
}

// AddLifecycleHook adds (or replaces) a lifecycle hook of group.
func (f *Server) AddLifecycleHook(group string, h LifecycleHook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.Transition == "" {
		h.Transition = TransitionTerminating
	}
	if h.HeartbeatTimeout == 0 {
		h.HeartbeatTimeout = defaultHeartbeatTimeout
	}
	if h.DefaultResult == "" {
		h.DefaultResult = "ABANDON"
	}
	if f.life.hooks == nil {
		f.life.hooks = map[string][]*LifecycleHook{}
	}
	hooks := slices.DeleteFunc(f.life.hooks[group], func(o *LifecycleHook) bool { return o.Name == h.Name })
	f.life.hooks[group] = append(hooks, &h)
}

// BeginTermination starts terminating an instance as Auto Scaling does on
// a scale-in: with termination hooks on its group the instance waits in
// Terminating:Wait, one lifecycle action per hook, each timing out after
// the hook's heartbeat timeout (extended by each heartbeat, up to the
// global timeout); without hooks it goes to Terminating. Once every hook
// is completed or timed out it is Terminating:Proceed; the test then ends
// it with Terminate.
func (f *Server) BeginTermination(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in := f.instances[id]
	if in == nil || in.Group == "" {
		panic(fmt.Sprintf("awsfake: BeginTermination(%q): no such instance in a group", id))
	}
	hooks := f.hooksOf(in.Group, TransitionTerminating)
	if len(hooks) == 0 {
		in.Lifecycle = "Terminating"
		return
	}
	in.Lifecycle = "Terminating:Wait"
	a := &lifecycleAction{group: in.Group, transition: TransitionTerminating, pending: map[string]*actionTimer{}}
	now := time.Now()
	for _, h := range hooks {
		at := &actionTimer{due: now.Add(h.HeartbeatTimeout), deadline: now.Add(h.globalTimeout())}
		at.timer = time.AfterFunc(h.HeartbeatTimeout, func() { f.expire(id, a, h) })
		a.pending[h.Name] = at
	}
	f.lifecycle().actions[id] = a
}

// LifecycleCalls returns the lifecycle action requests answered so far,
// and the timeouts, in order.
func (f *Server) LifecycleCalls() []LifecycleCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.life.calls)
}

func (f *Server) lifecycle() *lifecycleModel {
	if f.life.actions == nil {
		f.life.actions = map[string]*lifecycleAction{}
	}
	return &f.life
}

func (f *Server) hooksOf(group, transition string) []*LifecycleHook {
	var hs []*LifecycleHook
	for _, h := range f.life.hooks[group] {
		if h.Transition == transition {
			hs = append(hs, h)
		}
	}
	return hs
}

func (f *Server) hook(group, name string) *LifecycleHook {
	for _, h := range f.life.hooks[group] {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// action returns the pending action of instance id for hook h, or nil. An
// instance that a test put in a Wait state with Set has one without
// timeouts.
func (f *Server) action(id string, h *LifecycleHook) *lifecycleAction {
	in := f.instances[id]
	if in == nil || in.Group == "" {
		return nil
	}
	m := f.lifecycle()
	a := m.actions[id]
	if a == nil {
		var transition string
		switch in.Lifecycle {
		case "Terminating:Wait":
			transition = TransitionTerminating
		case "Pending:Wait":
			transition = TransitionLaunching
		default:
			return nil
		}
		a = &lifecycleAction{group: in.Group, transition: transition, pending: map[string]*actionTimer{}}
		for _, o := range f.hooksOf(in.Group, transition) {
			a.pending[o.Name] = &actionTimer{}
		}
		m.actions[id] = a
	}
	if a.group != in.Group || a.transition != h.Transition || a.pending[h.Name] == nil {
		return nil
	}
	return a
}

// finish ends hook h's part of action a of instance id with result, and
// moves the instance on once no hook is pending. The caller holds f.mu.
func (f *Server) finish(id string, a *lifecycleAction, h *LifecycleHook, result string) {
	if at := a.pending[h.Name]; at != nil && at.timer != nil {
		at.timer.Stop()
	}
	delete(a.pending, h.Name)
	if result == "ABANDON" {
		a.abandoned = true
	}
	if len(a.pending) > 0 {
		return
	}
	delete(f.life.actions, id)
	in := f.instances[id]
	switch {
	case a.transition == TransitionTerminating:
		in.Lifecycle = "Terminating:Proceed"
	case a.abandoned:
		in.Lifecycle = "Terminating"
	default:
		in.Lifecycle = "Pending:Proceed"
	}
}

// expire applies hook h's default result when its timeout passes.
func (f *Server) expire(id string, a *lifecycleAction, h *LifecycleHook) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := a.pending[h.Name]
	if f.life.actions[id] != a || at == nil {
		return // completed meanwhile
	}
	if time.Now().Before(at.due) {
		return // a heartbeat came as the timer fired, and re-armed it
	}
	f.life.calls = append(f.life.calls, LifecycleCall{
		Action: "Timeout", At: time.Now(), Group: a.group, Hook: h.Name, InstanceID: id, Result: h.DefaultResult,
	})
	f.finish(id, a, h, h.DefaultResult)
}

type lifecycleHookXML struct {
	LifecycleHookName    string `xml:"LifecycleHookName"`
	AutoScalingGroupName string `xml:"AutoScalingGroupName"`
	LifecycleTransition  string `xml:"LifecycleTransition"`
	HeartbeatTimeout     int    `xml:"HeartbeatTimeout"`
	GlobalTimeout        int    `xml:"GlobalTimeout"`
	DefaultResult        string `xml:"DefaultResult"`
}

type describeLifecycleHooksResponse struct {
	XMLName   xml.Name           `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ DescribeLifecycleHooksResponse"`
	Hooks     []lifecycleHookXML `xml:"DescribeLifecycleHooksResult>LifecycleHooks>member"`
	RequestID string             `xml:"ResponseMetadata>RequestId"`
}

type completeLifecycleActionResponse struct {
	XMLName   xml.Name `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ CompleteLifecycleActionResponse"`
	Result    struct{} `xml:"CompleteLifecycleActionResult"`
	RequestID string   `xml:"ResponseMetadata>RequestId"`
}

type recordLifecycleActionHeartbeatResponse struct {
	XMLName   xml.Name `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ RecordLifecycleActionHeartbeatResponse"`
	Result    struct{} `xml:"RecordLifecycleActionHeartbeatResult"`
	RequestID string   `xml:"ResponseMetadata>RequestId"`
}

// seconds is d in whole seconds, rounded up.
func seconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}

func (f *Server) describeLifecycleHooks(w http.ResponseWriter, r *http.Request) {
	group := r.Form.Get("AutoScalingGroupName")
	if group == "" {
		writeASGError(w, http.StatusBadRequest, "ValidationError", "1 validation error detected: Value null at 'autoScalingGroupName' failed to satisfy constraint: Member must not be null")
		return
	}
	if !f.groups[group] {
		writeASGError(w, http.StatusBadRequest, "ValidationError", "AutoScalingGroup name not found - AutoScalingGroup "+group+" not found")
		return
	}
	names := listParam(r, "LifecycleHookNames.member")
	var out []lifecycleHookXML
	for _, h := range f.life.hooks[group] {
		if len(names) > 0 && !slices.Contains(names, h.Name) {
			continue
		}
		out = append(out, lifecycleHookXML{
			LifecycleHookName: h.Name, AutoScalingGroupName: group, LifecycleTransition: h.Transition,
			HeartbeatTimeout: seconds(h.HeartbeatTimeout), GlobalTimeout: seconds(h.globalTimeout()), DefaultResult: h.DefaultResult,
		})
	}
	writeXML(w, describeLifecycleHooksResponse{Hooks: out, RequestID: "req-dlh"})
}

// lifecycleRequest validates the parameters common to
// CompleteLifecycleAction and RecordLifecycleActionHeartbeat, records the
// call, and returns the pending action, or answers the error AWS gives and
// returns nil.
func (f *Server) lifecycleRequest(w http.ResponseWriter, r *http.Request, action string) (string, *lifecycleAction, *LifecycleHook) {
	call := LifecycleCall{
		Action: action, At: time.Now(),
		Group: r.Form.Get("AutoScalingGroupName"), Hook: r.Form.Get("LifecycleHookName"),
		InstanceID: r.Form.Get("InstanceId"), Result: r.Form.Get("LifecycleActionResult"),
	}
	fail := func(msg string) (string, *lifecycleAction, *LifecycleHook) {
		call.Error = "ValidationError"
		f.life.calls = append(f.life.calls, call)
		writeASGError(w, http.StatusBadRequest, "ValidationError", msg)
		return "", nil, nil
	}
	if call.Group == "" || call.Hook == "" {
		return fail("1 validation error detected: AutoScalingGroupName and LifecycleHookName must not be null")
	}
	if action == "CompleteLifecycleAction" && call.Result != "CONTINUE" && call.Result != "ABANDON" {
		return fail(fmt.Sprintf("LifecycleActionResult %q is not valid: expected CONTINUE or ABANDON", call.Result))
	}
	if r.Form.Get("LifecycleActionToken") != "" {
		f.problem("%s by LifecycleActionToken: the fake knows actions by InstanceId only", action)
	}
	if call.InstanceID == "" {
		return fail("Either InstanceId or LifecycleActionToken must be specified")
	}
	if !f.groups[call.Group] {
		return fail("AutoScalingGroup name not found - AutoScalingGroup " + call.Group + " not found")
	}
	h := f.hook(call.Group, call.Hook)
	if h == nil {
		return fail("No Lifecycle Hook found with name " + call.Hook + " for group " + call.Group)
	}
	a := f.action(call.InstanceID, h)
	if a == nil || a.group != call.Group {
		return fail("No active Lifecycle Action found with instance ID " + call.InstanceID)
	}
	f.life.calls = append(f.life.calls, call)
	return call.InstanceID, a, h
}

func (f *Server) completeLifecycleAction(w http.ResponseWriter, r *http.Request) {
	id, a, h := f.lifecycleRequest(w, r, "CompleteLifecycleAction")
	if a == nil {
		return
	}
	f.finish(id, a, h, r.Form.Get("LifecycleActionResult"))
	writeXML(w, completeLifecycleActionResponse{RequestID: "req-cla"})
}

func (f *Server) recordLifecycleActionHeartbeat(w http.ResponseWriter, r *http.Request) {
	_, a, h := f.lifecycleRequest(w, r, "RecordLifecycleActionHeartbeat")
	if a == nil {
		return
	}
	// The action's timeout starts again, but never beyond the global one.
	if at := a.pending[h.Name]; at.timer != nil {
		d := min(h.HeartbeatTimeout, time.Until(at.deadline))
		at.due = time.Now().Add(d)
		at.timer.Reset(d)
	}
	writeXML(w, recordLifecycleActionHeartbeatResponse{RequestID: "req-rlah"})
}
