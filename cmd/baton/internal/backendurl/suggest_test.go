package backendurl

import (
	"strings"
	"testing"
)

// A mistyped URL gets a suggestion that is what was meant and that Parse
// accepts, or none: never a URL built by gluing the input after etcd://
// (such as etcd://raft:/ for raft:/).
func TestParseSuggestions(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want string // "" : no suggestion
	}{
		{"raft:/", "raft://"},
		{"raft:", "raft://"},
		{"raft", "raft://"},
		{"RAFT:/", "raft://"},
		{"rafft://", "raft://"},
		{"raf://", "raft://"},
		{"memroy://", "memory://"},
		{"etcd:/10.0.0.5:2379", "etcd://10.0.0.5:2379"},
		{"etcd:10.0.0.5:2379", "etcd://10.0.0.5:2379"},
		{"etdc://10.0.0.5:2379", "etcd://10.0.0.5:2379"},
		{"zookeeper://h:2181/svc", "zk://h:2181/svc"},
		{"consol://h:8500", "consul://h:8500"},
		{"agnet:///run/baton/a.sock", "agent:///run/baton/a.sock"},
		{"10.0.0.5:2379", "etcd://10.0.0.5:2379"},
		{"10.0.0.5:2379,10.0.0.6:2379", "etcd://10.0.0.5:2379,10.0.0.6:2379"},
		{"10.0.0.5:2181", "zk://10.0.0.5:2181"},
		{"127.0.0.1:8500", "consul://127.0.0.1:8500"},
		{"127.0.0.1:8790", "agent://127.0.0.1:8790"},
		{"//h:2379", "etcd://h:2379"},
		{"user:pa%25zz@h:2379", "etcd://user:xxxxx@h:2379"},
		{"http://h:2379", ""},
		{"mysql://db/x", ""},
		{"postgress://db/x", "postgres://db/x"},
		{"raft:/x/y?z", ""}, // raft:// takes nothing: raft://x/y?z is no URL to suggest
		{"", ""},
		{"h:99999", ""},
	} {
		_, err := Parse(tc.raw)
		if err == nil {
			t.Errorf("Parse(%q) accepted it", tc.raw)
			continue
		}
		got := suggestion(tc.raw, nil)
		if got != tc.want {
			t.Errorf("suggestion(%q) = %q, want %q (error: %v)", tc.raw, got, tc.want, err)
		}
		if tc.want != "" && !strings.Contains(err.Error(), "did you mean "+tc.want+"?") {
			t.Errorf("Parse(%q): %v; want it to ask: did you mean %s?", tc.raw, err, tc.want)
		}
		if tc.want == "" && strings.Contains(err.Error(), "did you mean") {
			t.Errorf("Parse(%q): %v; want no suggestion", tc.raw, err)
		}
		if strings.Contains(err.Error(), "etcd://"+tc.raw) && tc.raw != "" && !strings.HasPrefix(tc.want, "etcd://") {
			t.Errorf("Parse(%q): %v: suggests the input glued after etcd://", tc.raw, err)
		}
		if strings.Contains(err.Error(), "pa%25zz") {
			t.Errorf("Parse(%q): %v: shows the password", tc.raw, err)
		}
	}
}

// FuzzSuggestion: whatever the input, a suggestion Parse makes is a URL
// Parse accepts, and making one never panics.
func FuzzSuggestion(f *testing.F) {
	for _, seed := range []string{"raft:/", "raft", "rafft://", "etcd:h:2379", "h:2181", "zookeeper://h", "u:p@h:2379",
		"agnet:///a.sock", "//h", "etcd:/", "k8s:", ":", "://", "a:b:c", "memory:/x", "zk:2181", "agent:8790"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		s := suggestion(raw, nil)
		if s == "" {
			return
		}
		if _, err := Parse(s); err != nil {
			t.Fatalf("suggestion(%q) = %q, which Parse refuses: %v", raw, s, err)
		}
		if s == raw {
			t.Fatalf("suggestion(%q) is the input itself", raw)
		}
	})
}
