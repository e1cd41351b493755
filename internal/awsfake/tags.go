package awsfake

import (
	"encoding/xml"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// EC2 tags, as EC2 documents them: CreateTags and DeleteTags change the
// tags of instances, DescribeTags and the instance metadata read them.
// EC2 is eventually consistent: a write is accepted at once but reads see
// it only later. SetTagDelay models that; TagWrites keeps every accepted
// change in the order EC2 accepted it, so that a test can replay the
// writes and check what was true between any two of them.

func init() {
	register("CreateTags", true, (*Server).createTags)
	register("DeleteTags", true, (*Server).deleteTags)
	register("DescribeTags", true, (*Server).describeTags)
}

// EC2's limits on tags.
const (
	maxTagKey          = 127 // characters, as EC2's API reference gives
	maxTagValue        = 256 // characters
	maxTagsPerInstance = 50
)

// TagWrite is one change of one tag that EC2 accepted.
type TagWrite struct {
	// Seq numbers the changes from 1, in the order they were accepted.
	Seq int
	// Action is "CreateTags" or "DeleteTags".
	Action string
	// Instance is the ID of the instance whose tag changed.
	Instance string
	// Key is the tag's key, Value its new value (CreateTags) or the value
	// it had (DeleteTags).
	Key, Value string
	// At is when EC2 accepted the change; reads see it from At plus the
	// propagation delay then in force.
	At time.Time
}

// tagState is the Server's record of tag writes. Instance.Tags holds what
// reads see; pending holds accepted writes that reads do not see yet.
type tagState struct {
	delay   time.Duration
	pending []pendingTag
	writes  []TagWrite
}

type pendingTag struct {
	due time.Time
	w   TagWrite
}

// SetTagDelay makes every tag write accepted from now on visible to reads
// (DescribeTags, the instance metadata front) only d after it was
// accepted, as EC2's eventual consistency does. Writes are still applied
// in the order they were accepted. Zero, the default, makes them visible
// at once.
func (f *Server) SetTagDelay(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tags.delay = d
}

// PropagateTags makes every accepted tag write visible now, whatever the
// delay.
func (f *Server) PropagateTags() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settleTags(time.Time{})
}

// TagWrites lists every tag change EC2 accepted, in order. Deleting a tag
// that is absent changes nothing and is not listed; writing a tag's
// current value is.
func (f *Server) TagWrites() []TagWrite {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tags.writes)
}

// Tags returns a copy of the tags of instance id as reads see them now.
func (f *Server) Tags(id string) map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.settleTags(time.Now())
	in, ok := f.instances[id]
	if !ok || len(in.Tags) == 0 {
		return map[string]string{}
	}
	out := make(map[string]string, len(in.Tags))
	for k, v := range in.Tags {
		out[k] = v
	}
	return out
}

// settleTags makes the pending writes due by now visible; the zero time
// makes all of them visible. The caller holds f.mu.
func (f *Server) settleTags(now time.Time) {
	n := 0
	for _, p := range f.tags.pending {
		// Writes become visible in the order accepted: one that is not
		// due holds back the later ones, as a later delay may be shorter.
		if !now.IsZero() && p.due.After(now) {
			break
		}
		applyTag(f.instances[p.w.Instance], p.w)
		n++
	}
	f.tags.pending = f.tags.pending[n:]
}

func applyTag(in *Instance, w TagWrite) {
	if in == nil {
		return
	}
	if w.Action == "DeleteTags" {
		delete(in.Tags, w.Key)
		return
	}
	if in.Tags == nil {
		in.Tags = map[string]string{}
	}
	in.Tags[w.Key] = w.Value
}

// current returns the tags of in as accepted so far, visible or not: EC2
// checks a write against them, not against what reads see. The caller
// holds f.mu.
func (f *Server) current(in *Instance) map[string]string {
	tags := make(map[string]string, len(in.Tags))
	for k, v := range in.Tags {
		tags[k] = v
	}
	for _, p := range f.tags.pending {
		if p.w.Instance == in.ID {
			if p.w.Action == "DeleteTags" {
				delete(tags, p.w.Key)
			} else {
				tags[p.w.Key] = p.w.Value
			}
		}
	}
	return tags
}

// accept records a tag change and queues it for reads. The caller holds
// f.mu.
func (f *Server) accept(action, id, key, value string) {
	now := time.Now()
	w := TagWrite{Seq: len(f.tags.writes) + 1, Action: action, Instance: id, Key: key, Value: value, At: now}
	f.tags.writes = append(f.tags.writes, w)
	f.tags.pending = append(f.tags.pending, pendingTag{due: now.Add(f.tags.delay), w: w})
	f.settleTags(now)
}

// tagParam is one Tag.N of a request; hasValue tells an empty value from
// none (DeleteTags treats them differently).
type tagParam struct {
	key, value string
	hasValue   bool
}

func tagParams(r *http.Request) []tagParam {
	var tags []tagParam
	for i := 1; ; i++ {
		p := "Tag." + strconv.Itoa(i)
		k, ok := r.Form[p+".Key"]
		if !ok {
			return tags
		}
		v, hasValue := r.Form[p+".Value"]
		t := tagParam{key: k[0], hasValue: hasValue}
		if hasValue {
			t.value = v[0]
		}
		tags = append(tags, t)
	}
}

// tagResources checks the ResourceId list: every ID must be an instance
// the fake knows, and the fake knows only instances. It writes EC2's error
// and returns false otherwise. A request names the whole list or fails.
func (f *Server) tagResources(w http.ResponseWriter, r *http.Request) ([]*Instance, bool) {
	ids := listParam(r, "ResourceId")
	if len(ids) == 0 {
		writeEC2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameter resourceIdSet")
		return nil, false
	}
	if len(ids) > 1000 {
		writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", "Too many resource IDs: at most 1000")
		return nil, false
	}
	var ins []*Instance
	for _, id := range ids {
		if !strings.HasPrefix(id, "i-") {
			f.problem("tag request for resource %q: the fake knows only instances", id)
			writeEC2Error(w, http.StatusBadRequest, "InvalidID", "The ID '"+id+"' is not valid")
			return nil, false
		}
		in, ok := f.instances[id]
		if !ok {
			writeEC2Error(w, http.StatusBadRequest, "InvalidInstanceID.NotFound", "The instance ID '"+id+"' does not exist")
			return nil, false
		}
		ins = append(ins, in)
	}
	return ins, true
}

// checkTagKey returns EC2's complaint about a key, or "".
func checkTagKey(key string) string {
	switch {
	case key == "":
		return "Tag key cannot be empty"
	case utf8.RuneCountInString(key) > maxTagKey:
		return "Tag key exceeds the maximum length of 127 characters"
	case strings.HasPrefix(strings.ToLower(key), "aws:"):
		return "Tag keys starting with 'aws:' are reserved for internal use"
	}
	return ""
}

type tagResponse struct {
	XMLName   xml.Name
	RequestID string `xml:"requestId"`
	Return    bool   `xml:"return"`
}

func (f *Server) createTags(w http.ResponseWriter, r *http.Request) {
	ins, ok := f.tagResources(w, r)
	if !ok {
		return
	}
	tags := tagParams(r)
	if len(tags) == 0 {
		writeEC2Error(w, http.StatusBadRequest, "MissingParameter", "The request must contain the parameter tagSet")
		return
	}
	for _, t := range tags {
		if msg := checkTagKey(t.key); msg != "" {
			writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", msg)
			return
		}
		if utf8.RuneCountInString(t.value) > maxTagValue {
			writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", "Tag value exceeds the maximum length of 256 characters")
			return
		}
	}
	for _, in := range ins {
		cur := f.current(in)
		for _, t := range tags {
			cur[t.key] = t.value
		}
		if len(cur) > maxTagsPerInstance {
			writeEC2Error(w, http.StatusBadRequest, "TagLimitExceeded", "The maximum number of tags for the resource "+in.ID+" has been reached")
			return
		}
	}
	for _, in := range ins {
		for _, t := range tags {
			f.accept("CreateTags", in.ID, t.key, t.value)
		}
	}
	writeXML(w, tagResponse{XMLName: xml.Name{Space: ec2Namespace, Local: "CreateTagsResponse"}, RequestID: "req-tags", Return: true})
}

func (f *Server) deleteTags(w http.ResponseWriter, r *http.Request) {
	ins, ok := f.tagResources(w, r)
	if !ok {
		return
	}
	tags := tagParams(r)
	for _, t := range tags {
		if msg := checkTagKey(t.key); msg != "" {
			writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", msg)
			return
		}
	}
	for _, in := range ins {
		cur := f.current(in)
		if len(tags) == 0 {
			// No tags named: every user-defined tag goes.
			keys := make([]string, 0, len(cur))
			for k := range cur {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				if !strings.HasPrefix(strings.ToLower(k), "aws:") {
					f.accept("DeleteTags", in.ID, k, cur[k])
				}
			}
			continue
		}
		for _, t := range tags {
			v, present := cur[t.key]
			// A key with a value deletes the tag only if the value matches,
			// an empty one included; a key alone deletes it whatever its
			// value.
			if present && (!t.hasValue || t.value == v) {
				f.accept("DeleteTags", in.ID, t.key, v)
				delete(cur, t.key)
			}
		}
	}
	writeXML(w, tagResponse{XMLName: xml.Name{Space: ec2Namespace, Local: "DeleteTagsResponse"}, RequestID: "req-tags", Return: true})
}

type tagDescriptionXML struct {
	ResourceID   string `xml:"resourceId"`
	ResourceType string `xml:"resourceType"`
	Key          string `xml:"key"`
	Value        string `xml:"value"`
}

type describeTagsResponse struct {
	XMLName   xml.Name            `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeTagsResponse"`
	RequestID string              `xml:"requestId"`
	Tags      []tagDescriptionXML `xml:"tagSet>item"`
	NextToken string              `xml:"nextToken,omitempty"`
}

const ec2Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

// describeTags lists the visible tags of instances, filtered by key,
// value, resource-id and resource-type: the values of one filter are
// alternatives, and every filter must match. Wildcards are not modelled.
func (f *Server) describeTags(w http.ResponseWriter, r *http.Request) {
	f.settleTags(time.Now())
	filters := map[string][]string{}
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		name, ok := r.Form[p+".Name"]
		if !ok {
			break
		}
		switch name[0] {
		case "key", "value", "resource-id", "resource-type":
		default:
			writeEC2Error(w, http.StatusBadRequest, "InvalidParameterValue", "The filter '"+name[0]+"' is invalid")
			return
		}
		vals := listParam(r, p+".Value")
		for _, v := range vals {
			if strings.ContainsAny(v, "*?") {
				f.problem("DescribeTags filter %s=%q: the fake does not model wildcards", name[0], v)
			}
		}
		filters[name[0]] = append(filters[name[0]], vals...)
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
	match := func(name, v string) bool {
		vals, ok := filters[name]
		return !ok || slices.Contains(vals, v)
	}
	var found []tagDescriptionXML
	for _, id := range f.order {
		in := f.instances[id]
		if !match("resource-id", id) || !match("resource-type", "instance") {
			continue
		}
		keys := make([]string, 0, len(in.Tags))
		for k := range in.Tags {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if match("key", k) && match("value", in.Tags[k]) {
				found = append(found, tagDescriptionXML{ResourceID: id, ResourceType: "instance", Key: k, Value: in.Tags[k]})
			}
		}
	}
	from, to, next, ok := page(len(found), pageSize, r.Form.Get("NextToken"))
	if !ok {
		writeEC2Error(w, http.StatusBadRequest, "InvalidPaginationToken", "The token is invalid.")
		return
	}
	writeXML(w, describeTagsResponse{RequestID: "req-tags", Tags: found[from:to], NextToken: next})
}

// The paths under which the instance metadata service serves an
// instance's tags, when instance metadata tags are enabled.
const imdsTagsPath = "/latest/meta-data/tags/instance"

// imdsInstanceIDPath is where the instance metadata service gives the
// instance's id.
const imdsInstanceIDPath = "/latest/meta-data/instance-id"

// IMDSFront serves the instance metadata of instance id at the URL it
// returns, until the test ends. It answers the tags paths (imdsTagsPath
// lists the keys, one a line; imdsTagsPath/KEY gives a value; 404 for an
// absent key) from f's tags as reads see them, with the same propagation
// delay, as the instance metadata service does for an instance with
// instance metadata tags enabled, and the instance-id path with id, so
// that one mock stands for any instance of the group. Everything else, the IMDSv2 session
// token handshake included, goes to the metadata mock at mockURL, whose
// tags are fixed. A tags request needs a session token that the mock
// accepts: the front asks the mock, so that IMDSv2 holds on these paths too.
func (f *Server) IMDSFront(t testing.TB, mockURL, id string) string {
	t.Helper()
	target, err := url.Parse(mockURL)
	if err != nil {
		t.Fatalf("IMDSFront: metadata mock URL %q: %v", mockURL, err)
	}
	// Rewrite, not Director: the proxy then adds no X-Forwarded-For, which
	// the instance metadata service refuses on token requests.
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		self := r.URL.Path == imdsInstanceIDPath
		if !self && r.URL.Path != imdsTagsPath && !strings.HasPrefix(r.URL.Path, imdsTagsPath+"/") {
			proxy.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet {
			http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
			return
		}
		if status := tokenStatus(r, mockURL); status != http.StatusOK {
			w.WriteHeader(status)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		if self {
			w.Write([]byte(id))
			return
		}
		tags := f.Tags(id)
		key := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, imdsTagsPath), "/")
		if key == "" {
			keys := make([]string, 0, len(tags))
			for k := range tags {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			w.Write([]byte(strings.Join(keys, "\n")))
			return
		}
		v, ok := tags[key]
		if !ok {
			http.Error(w, "Not Found", http.StatusNotFound)
			return
		}
		w.Write([]byte(v))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// tokenStatus asks the metadata mock whether the request's IMDSv2 session
// token is good, by reading a path that the mock always serves with it.
func tokenStatus(r *http.Request, mockURL string) int {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, mockURL+"/latest/meta-data/instance-id", nil)
	if err != nil {
		return http.StatusInternalServerError
	}
	if tok := r.Header.Get("X-aws-ec2-metadata-token"); tok != "" {
		req.Header.Set("X-aws-ec2-metadata-token", tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return http.StatusBadGateway
	}
	resp.Body.Close()
	return resp.StatusCode
}
