package aws

import (
	"encoding/xml"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeAWS is a small in-memory model of Auto Scaling groups and their EC2
// instances, served over the Query protocol that the real SDK clients speak:
// form-encoded POSTs with Action and Version, XML answers in the services'
// shapes, NextToken pagination, and throttling errors on demand. Tests
// mutate the model between calls.
type fakeAWS struct {
	srv *httptest.Server

	mu        sync.Mutex
	groups    map[string]bool // names of the groups that exist
	instances map[string]*fakeInstance
	order     []string // instance IDs in launch order
	pageSize  int      // most items in one page of any list
	throttle  map[string]int
	calls     map[string]int // by Action, throttled ones included
	batches   []int          // instance IDs in each DescribeInstances request
	problems  []string       // protocol violations seen
	held      chan struct{}  // while non-nil, requests wait for it to close
	arrived   chan struct{}  // receives one value per request that waits
}

// fakeInstance is one EC2 instance and, when Group is set, its membership
// in an Auto Scaling group.
type fakeInstance struct {
	ID        string
	Group     string // "" when in no group
	Lifecycle string // Auto Scaling lifecycle state
	Health    string // "Healthy" or "Unhealthy"
	State     string // EC2 state: "running", "terminated", ...
	PrivateIP string
}

const (
	ec2Version = "2016-11-15"
	asgVersion = "2011-01-01"
)

func startFakeAWS(t *testing.T) *fakeAWS {
	t.Helper()
	f := &fakeAWS{
		groups:    map[string]bool{},
		instances: map[string]*fakeInstance{},
		pageSize:  7,
		throttle:  map[string]int{},
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
func (f *fakeAWS) URL() string { return f.srv.URL }

// addGroup creates an empty group.
func (f *fakeAWS) addGroup(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.groups[name] = true
}

// launch adds a running instance; group "" leaves it outside any group.
func (f *fakeAWS) launch(id, group, lifecycle, health, ip string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances[id] = &fakeInstance{ID: id, Group: group, Lifecycle: lifecycle, Health: health, State: "running", PrivateIP: ip}
	f.order = append(f.order, id)
}

// deleteGroup removes a group and its instances' membership.
func (f *fakeAWS) deleteGroup(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.groups, name)
	for _, in := range f.instances {
		if in.Group == name {
			in.Group = ""
		}
	}
}

// set changes an instance.
func (f *fakeAWS) set(id string, change func(*fakeInstance)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f.instances[id])
}

// terminate ends an instance as Auto Scaling does once termination
// completes: out of the group, EC2 state terminated, no private IP.
func (f *fakeAWS) terminate(id string) {
	f.set(id, func(in *fakeInstance) {
		in.Group, in.Lifecycle, in.State, in.PrivateIP = "", "", "terminated", ""
	})
}

// throttleNext makes the next n requests of action fail with the service's
// throttling error.
func (f *fakeAWS) throttleNext(action string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttle[action] = n
}

func (f *fakeAWS) callCount(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[action]
}

func (f *fakeAWS) totalCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		n += c
	}
	return n
}

func (f *fakeAWS) describeInstancesBatches() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches)
}

func (f *fakeAWS) protocolProblems() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.problems)
}

// hold makes requests wait until release is called; arrived receives a
// value as each request starts waiting.
func (f *fakeAWS) hold() (arrived <-chan struct{}, release func()) {
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

func (f *fakeAWS) serveHTTP(w http.ResponseWriter, r *http.Request) {
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
	if action == "DescribeInstances" {
		wantVersion = ec2Version
	}
	if version != wantVersion {
		f.problem("%s with Version %q, want %q", action, version, wantVersion)
	}
	if f.throttle[action] > 0 {
		f.throttle[action]--
		if action == "DescribeInstances" {
			writeEC2Error(w, http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
		} else {
			writeASGError(w, http.StatusBadRequest, "Throttling", "Rate exceeded")
		}
		return
	}
	switch action {
	case "DescribeAutoScalingInstances":
		f.describeAutoScalingInstances(w, r)
	case "DescribeAutoScalingGroups":
		f.describeAutoScalingGroups(w, r)
	case "DescribeInstances":
		f.describeInstances(w, r)
	default:
		f.problem("unexpected Action %q", action)
		writeASGError(w, http.StatusBadRequest, "InvalidAction", "unknown action "+action)
	}
}

// problem records a protocol violation. The caller holds f.mu.
func (f *fakeAWS) problem(format string, args ...any) {
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

// Auto Scaling ------------------------------------------------------------

type asgInstanceXML struct {
	InstanceID           string `xml:"InstanceId"`
	AutoScalingGroupName string `xml:"AutoScalingGroupName,omitempty"`
	AvailabilityZone     string `xml:"AvailabilityZone"`
	LifecycleState       string `xml:"LifecycleState"`
	HealthStatus         string `xml:"HealthStatus"`
	ProtectedFromScaleIn bool   `xml:"ProtectedFromScaleIn"`
}

type asgGroupXML struct {
	AutoScalingGroupName string           `xml:"AutoScalingGroupName"`
	AutoScalingGroupARN  string           `xml:"AutoScalingGroupARN"`
	MinSize              int              `xml:"MinSize"`
	MaxSize              int              `xml:"MaxSize"`
	DesiredCapacity      int              `xml:"DesiredCapacity"`
	Instances            []asgInstanceXML `xml:"Instances>member"`
}

type describeAutoScalingGroupsResponse struct {
	XMLName   xml.Name      `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ DescribeAutoScalingGroupsResponse"`
	Groups    []asgGroupXML `xml:"DescribeAutoScalingGroupsResult>AutoScalingGroups>member"`
	NextToken string        `xml:"DescribeAutoScalingGroupsResult>NextToken,omitempty"`
	RequestID string        `xml:"ResponseMetadata>RequestId"`
}

type describeAutoScalingInstancesResponse struct {
	XMLName   xml.Name         `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ DescribeAutoScalingInstancesResponse"`
	Instances []asgInstanceXML `xml:"DescribeAutoScalingInstancesResult>AutoScalingInstances>member"`
	NextToken string           `xml:"DescribeAutoScalingInstancesResult>NextToken,omitempty"`
	RequestID string           `xml:"ResponseMetadata>RequestId"`
}

func (f *fakeAWS) asgXML(in *fakeInstance, withGroup bool) asgInstanceXML {
	x := asgInstanceXML{InstanceID: in.ID, AvailabilityZone: "us-east-1a", LifecycleState: in.Lifecycle, HealthStatus: in.Health}
	if withGroup {
		x.AutoScalingGroupName = in.Group
	}
	return x
}

func (f *fakeAWS) describeAutoScalingInstances(w http.ResponseWriter, r *http.Request) {
	ids := listParam(r, "InstanceIds.member")
	var found []asgInstanceXML
	for _, id := range ids {
		if in, ok := f.instances[id]; ok && in.Group != "" {
			found = append(found, f.asgXML(in, true))
		}
	}
	writeXML(w, describeAutoScalingInstancesResponse{Instances: found, RequestID: "req-asi"})
}

func (f *fakeAWS) describeAutoScalingGroups(w http.ResponseWriter, r *http.Request) {
	names := listParam(r, "AutoScalingGroupNames.member")
	if len(names) == 0 {
		for name := range f.groups {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var groups []asgGroupXML
	for _, name := range names {
		if !f.groups[name] {
			continue // unknown names are left out, as AWS does
		}
		g := asgGroupXML{
			AutoScalingGroupName: name,
			AutoScalingGroupARN:  "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:0:autoScalingGroupName/" + name,
			MaxSize:              1000,
		}
		for _, id := range f.order {
			if in := f.instances[id]; in.Group == name {
				g.Instances = append(g.Instances, f.asgXML(in, false))
			}
		}
		g.DesiredCapacity = len(g.Instances)
		groups = append(groups, g)
	}
	from, to, next, ok := page(len(groups), f.pageSize, r.Form.Get("NextToken"))
	if !ok {
		writeASGError(w, http.StatusBadRequest, "InvalidNextToken", "The token is invalid.")
		return
	}
	writeXML(w, describeAutoScalingGroupsResponse{Groups: groups[from:to], NextToken: next, RequestID: "req-asg"})
}

type asgErrorResponse struct {
	XMLName   xml.Name `xml:"http://autoscaling.amazonaws.com/doc/2011-01-01/ ErrorResponse"`
	Type      string   `xml:"Error>Type"`
	Code      string   `xml:"Error>Code"`
	Message   string   `xml:"Error>Message"`
	RequestID string   `xml:"RequestId"`
}

func writeASGError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	xml.NewEncoder(w).Encode(asgErrorResponse{Type: "Sender", Code: code, Message: msg, RequestID: "req-err"})
}

// EC2 ---------------------------------------------------------------------

type ec2InstanceXML struct {
	InstanceID       string `xml:"instanceId"`
	ImageID          string `xml:"imageId"`
	StateCode        int    `xml:"instanceState>code"`
	StateName        string `xml:"instanceState>name"`
	PrivateIPAddress string `xml:"privateIpAddress,omitempty"`
	InstanceType     string `xml:"instanceType"`
}

type ec2ReservationXML struct {
	ReservationID string           `xml:"reservationId"`
	OwnerID       string           `xml:"ownerId"`
	Instances     []ec2InstanceXML `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName      xml.Name            `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstancesResponse"`
	RequestID    string              `xml:"requestId"`
	Reservations []ec2ReservationXML `xml:"reservationSet>item"`
	NextToken    string              `xml:"nextToken,omitempty"`
}

var ec2StateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func (f *fakeAWS) describeInstances(w http.ResponseWriter, r *http.Request) {
	ids := listParam(r, "InstanceId")
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		name, ok := r.Form[p+".Name"]
		if !ok {
			break
		}
		if name[0] != "instance-id" {
			f.problem("DescribeInstances filter %q: the fake knows only instance-id", name[0])
			continue
		}
		ids = append(ids, listParam(r, p+".Value")...)
	}
	if r.Form.Get("NextToken") == "" {
		f.batches = append(f.batches, len(ids))
	}
	if len(ids) == 0 {
		// Real EC2 would describe every instance in the region.
		f.problem("DescribeInstances without instance IDs")
		writeEC2Error(w, http.StatusBadRequest, "InvalidParameterCombination", "the fake refuses unbounded DescribeInstances")
		return
	}
	if len(r.Form["InstanceId.1"]) > 0 && r.Form.Get("MaxResults") != "" {
		writeEC2Error(w, http.StatusBadRequest, "InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
		return
	}
	pageSize := f.pageSize
	if m := r.Form.Get("MaxResults"); m != "" {
		n, err := strconv.Atoi(m)
		if err != nil || n < 5 || n > 1000 {
			writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", "MaxResults must be 5-1000")
			return
		}
		pageSize = min(pageSize, n)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var matches []*fakeInstance
	for _, id := range f.order {
		if want[id] {
			matches = append(matches, f.instances[id])
		}
	}
	from, to, next, ok := page(len(matches), pageSize, r.Form.Get("NextToken"))
	if !ok {
		writeEC2Error(w, http.StatusBadRequest, "InvalidPaginationToken", "The token is invalid.")
		return
	}
	// One reservation per instance, as for instances launched one by one.
	var res []ec2ReservationXML
	for _, in := range matches[from:to] {
		res = append(res, ec2ReservationXML{
			ReservationID: "r-" + strings.TrimPrefix(in.ID, "i-"),
			OwnerID:       "123456789012",
			Instances: []ec2InstanceXML{{
				InstanceID: in.ID, ImageID: "ami-12345678", InstanceType: "t3.micro",
				StateCode: ec2StateCodes[in.State], StateName: in.State, PrivateIPAddress: in.PrivateIP,
			}},
		})
	}
	writeXML(w, describeInstancesResponse{RequestID: "req-ec2", Reservations: res, NextToken: next})
}

type ec2ErrorResponse struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

func writeEC2Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	xml.NewEncoder(w).Encode(ec2ErrorResponse{Code: code, Message: msg, RequestID: "req-err"})
}

func writeXML(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "text/xml")
	w.Write([]byte(xml.Header))
	xml.NewEncoder(w).Encode(v)
}
