package backendurl

import (
	"strings"
	"testing"
)

// TestRedisURLs: the Redis schemes parse without connecting, name their
// hosts, and refuse what baton cannot run (Redis Cluster) or cannot read,
// with an error that names the problem and never the password.
func TestRedisURLs(t *testing.T) {
	for raw, hosts := range map[string]string{
		"redis://u:pw@cache.internal:6380/2":                  "cache.internal",
		"rediss://127.0.0.1":                                  "127.0.0.1",
		"redis+sentinel://s1,s2:26380,[::1]/mymaster":         "s1 s2 ::1",
		"rediss+sentinel://s1/mymaster?baton_replicas=2":      "s1",
		"REDIS://h/0?baton_prefix=app:&baton_pubsub=off":      "h",
		"redis://h/0?dial_timeout=3s&baton_replicas=0":        "h",
		"redis+sentinel://u:pw@s1/m/1?sentinel_username=sent": "s1",
	} {
		spec, err := Parse(raw)
		if err != nil {
			t.Errorf("Parse(%q): %v", raw, err)
			continue
		}
		if got := strings.Join(spec.Hosts, " "); got != hosts {
			t.Errorf("Parse(%q) hosts %q; want %q", raw, got, hosts)
		}
	}
	for raw, want := range map[string]string{
		"redis://h1:6379,h2:6379":              "Redis Cluster is not supported",
		"redis+cluster://h:7000":               "Redis Cluster is not supported",
		"redis+sentinel://s1:26379":            "no master name",
		"redis://h/0?baton_replicas=-1":        "baton_replicas=-1",
		"redis://h/0?baton_pubsub=maybe":       "baton_pubsub=maybe",
		"redis://u:hunter22@h/0?nonsense=1":    "nonsense",
		"redis://h/0?password_file=/no/such":   "password_file",
		"redis+sentinel://u:hunter22@s/m?zz=1": "unknown parameter",
		"redis://[fe80::1%25lo]:6379":          "zone",
	} {
		_, err := Parse(raw)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v; want an error saying %q", raw, err, want)
			continue
		}
		if strings.Contains(err.Error(), "hunter22") {
			t.Errorf("Parse(%q): the error holds the password: %v", raw, err)
		}
	}
}
