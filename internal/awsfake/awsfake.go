// Package awsfake is an in-memory model of EC2 Auto Scaling groups and their
// instances, served over the AWS Query protocol that the real aws-sdk-go-v2
// clients speak, and of the Parameter Store parameters and Secrets Manager
// secrets that hold a group's secret, served over the JSON protocol. No emulator of these APIs runs here, so the tests of the
// aws module and of the CLI point the real SDK at this server instead.
//
// Each action is a handler registered by the file of its service; tests
// change the model between calls and read back what was called.
package awsfake

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is a small in-memory model of Auto Scaling groups and their EC2
// instances, served over the Query protocol that the real SDK clients speak:
// form-encoded POSTs with Action and Version, XML answers in the services'
// shapes, NextToken pagination, and throttling errors on demand. Tests
// mutate the model between calls.
type Server struct {
	srv *httptest.Server

	mu        sync.Mutex
	groups    map[string]bool // names of the groups that exist
	desired   map[string]int  // desired capacity by group, when set
	instances map[string]*Instance
	order     []string // instance IDs in launch order
	pageSize  int      // most items in one page of any list
	throttle  map[string]int
	fail      map[string]failure
	calls     map[string]int // by Action, throttled ones included
	batches   []int          // instance IDs in each DescribeInstances request
	problems  []string       // protocol violations seen
	held      chan struct{}  // while non-nil, requests wait for it to close
	arrived   chan struct{}  // receives one value per request that waits
	tags      tagState       // tag writes and their propagation: tags.go
	life      lifecycleModel // lifecycle hooks and actions: lifecycle.go
	sec       secretState    // parameters and secrets: secrets.go
}

// Instance is one EC2 instance and, when Group is set, its membership
// in an Auto Scaling group.
type Instance struct {
	ID        string
	Group     string // "" when in no group
	Lifecycle string // Auto Scaling lifecycle state
	Health    string // "Healthy" or "Unhealthy"
	State     string // EC2 state: "running", "terminated", ...
	PrivateIP string
	Tags      map[string]string // EC2 tags as reads see them; see tags.go
	// LaunchTime is when EC2 launched the instance: Launch sets it a second
	// after the previous Launch's, so that launch order is call order.
	LaunchTime time.Time
}

// A handler answers one Action. It runs with f.mu held.
type handler func(f *Server, w http.ResponseWriter, r *http.Request)

var (
	handlers   = map[string]handler{}
	ec2Actions = map[string]bool{}
)

// register makes h answer action; ec2 says which service (and so which
// API version and error shape) the action belongs to. Each service's file
// registers its actions in init.
func register(action string, ec2 bool, h handler) {
	handlers[action] = h
	ec2Actions[action] = ec2
}

const (
	ec2Version = "2016-11-15"
	asgVersion = "2011-01-01"
)

// Start serves a new, empty model on a loopback port until t ends, and
// fails t at the end with any protocol violation it saw.
func Start(t testing.TB) *Server {
	t.Helper()
	f := &Server{
		groups:    map[string]bool{},
		desired:   map[string]int{},
		instances: map[string]*Instance{},
		pageSize:  7,
		throttle:  map[string]int{},
		fail:      map[string]failure{},
		calls:     map[string]int{},
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	f.srv = &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(f.serveHTTP)}}
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	t.Cleanup(func() {
		for _, p := range f.protocolProblems() {
			t.Errorf("fake AWS: %s", p)
		}
	})
	return f
}

// URL is the endpoint of both services.
func (f *Server) URL() string { return f.srv.URL }

// AddGroup creates an empty group.
func (f *Server) AddGroup(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[name] = true
}

// Launch adds a running instance; group "" leaves it outside any group.
func (f *Server) Launch(id, group, lifecycle, health, ip string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances[id] = &Instance{ID: id, Group: group, Lifecycle: lifecycle, Health: health, State: "running", PrivateIP: ip,
		LaunchTime: launchEpoch.Add(time.Duration(len(f.order)) * time.Second)}
	f.order = append(f.order, id)
}

// launchEpoch is the LaunchTime of the first instance a fake launches.
var launchEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// SetDesired sets group's desired capacity, which DescribeAutoScalingGroups
// reports; until it is set, the capacity is the number of the group's
// instances.
func (f *Server) SetDesired(group string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.desired[group] = n
}

// DeleteGroup removes a group and its instances' membership.
func (f *Server) DeleteGroup(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.groups, name)
	for _, in := range f.instances {
		if in.Group == name {
			in.Group = ""
		}
	}
}

// Set changes an instance.
func (f *Server) Set(id string, change func(*Instance)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.instances[id])
}

// Terminate ends an instance as Auto Scaling does once termination
// completes: out of the group, EC2 state terminated, no private IP.
func (f *Server) Terminate(id string) {
	f.Set(id, func(in *Instance) {
		in.Group, in.Lifecycle, in.State, in.PrivateIP = "", "", "terminated", ""
	})
}

// ThrottleNext makes the next n requests of action fail with the service's
// throttling error.
func (f *Server) ThrottleNext(action string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttle[action] = n
}

// failure is an error that the next n requests of an action get.
type failure struct {
	n      int
	status int
	code   string
}

// FailNext makes the next n requests of action fail with the HTTP status
// and the service's error code, such as 500 and "InternalFailure" (Auto
// Scaling) or "InternalError" (EC2).
func (f *Server) FailNext(action string, n, status int, code string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[action] = failure{n: n, status: status, code: code}
}

// CallCount is how many requests of action arrived, throttled ones included.
func (f *Server) CallCount(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[action]
}

// TotalCalls is how many requests of any action arrived.
func (f *Server) TotalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

// DescribeInstancesBatches is the number of instance IDs in each
// DescribeInstances request (pages after the first are not counted).
func (f *Server) DescribeInstancesBatches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches)
}

func (f *Server) protocolProblems() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.problems)
}

// Hold makes requests wait until release is called; arrived receives a
// value as each request starts waiting.
func (f *Server) Hold() (arrived <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held, f.arrived = make(chan struct{}), make(chan struct{}, 1000)
	held := f.held
	return f.arrived, func() {
		f.mu.Lock()
		f.held, f.arrived = nil, nil
		f.mu.Unlock()
		close(held)
	}
}

func (f *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if target := r.Header.Get("X-Amz-Target"); target != "" {
		// Parameter Store and Secrets Manager: the JSON protocol.
		f.mu.Lock()
		defer f.mu.Unlock()
		f.serveJSON(w, r, target)
		return
	}
	// Read the whole request before holding it, so that a client that
	// gives up while held leaves nothing half-read.
	formErr := r.ParseForm()

	f.mu.Lock()
	held, arrived := f.held, f.arrived
	f.mu.Unlock()
	if held != nil {
		arrived <- struct{}{}
		<-held
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method != http.MethodPost {
		f.problem("%s %s: the Query protocol POSTs", r.Method, r.URL)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	if formErr != nil {
		if errors.Is(formErr, io.ErrUnexpectedEOF) {
			return // the client gave up while sending; no protocol fault
		}
		f.problem("bad form: %v", formErr)
		http.Error(w, formErr.Error(), http.StatusBadRequest)
		return
	}
	if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
		f.problem("%s request is not signed with SigV4", r.Form.Get("Action"))
	}
	action, version := r.Form.Get("Action"), r.Form.Get("Version")
	f.calls[action]++
	wantVersion := asgVersion
	if ec2Actions[action] {
		wantVersion = ec2Version
	}
	if version != wantVersion {
		f.problem("%s with Version %q, want %q", action, version, wantVersion)
	}
	if f.throttle[action] > 0 {
		f.throttle[action]--
		if ec2Actions[action] {
			writeEC2Error(w, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
		} else {
			writeASGError(w, http.StatusBadRequest, "Throttling", "Rate exceeded")
		}
		return
	}
	if fl := f.fail[action]; fl.n > 0 {
		fl.n--
		f.fail[action] = fl
		if ec2Actions[action] {
			writeEC2Error(w, fl.status, fl.code, "injected failure")
		} else {
			writeASGError(w, fl.status, fl.code, "injected failure")
		}
		return
	}
	h, ok := handlers[action]
	if !ok {
		f.problem("unexpected Action %q", action)
		writeASGError(w, http.StatusBadRequest, "InvalidAction", "unknown action "+action)
		return
	}
	h(f, w, r)
}

// problem records a protocol violation. The caller holds f.mu.
func (f *Server) problem(format string, args ...any) {
	f.problems = append(f.problems, fmt.Sprintf(format, args...))
}

// listParam collects the values of a Query-protocol list: prefix.1,
// prefix.2, ... in order.
func listParam(r *http.Request, prefix string) []string {
	var vs []string
	for i := 1; ; i++ {
		v, ok := r.Form[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return vs
		}
		vs = append(vs, v[0])
	}
}

// page cuts a list of n items into pages of size, returning the bounds of
// the page that token names ("" for the first) and the next token, or ""
// after the last page.
func page(n, size int, token string) (from, to int, next string, ok bool) {
	if token != "" {
		off, err := strconv.Atoi(strings.TrimPrefix(token, "page-"))
		if err != nil || !strings.HasPrefix(token, "page-") || off < 0 || off > n {
			return 0, 0, "", false
		}
		from = off
	}
	to = min(from+size, n)
	if to < n {
		next = "page-" + strconv.Itoa(to)
	}
	return from, to, next, true
}

func writeXML(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "text/xml")
	w.Write([]byte(xml.Header))
	xml.NewEncoder(w).Encode(v)
}
