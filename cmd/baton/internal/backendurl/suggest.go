package backendurl

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// aliases are scheme names people write for a scheme of another name.
var aliases = map[string]string{
	"zookeeper": "zk", "etcd3": "etcd", "etcdv3": "etcd", "kubernetes": "k8s", "kube": "k8s", "mem": "memory",
}

// defaultPorts guess a scheme from the port of a URL written without one.
var defaultPorts = map[string]string{"2379": "etcd", "2181": "zk", "8500": "consul", "8790": "agent"}

// suggestion returns a URL, close to raw, that Parse accepts, for an error
// about raw ("did you mean ...?"), or "" when none is close enough to be
// what was meant: raw with its scheme's "//" restored (raft:/, raft:,
// etcd:h:2379), a misspelt or aliased scheme corrected (rafft://,
// zookeeper://h), or a host:port without a scheme given the scheme whose
// default port it names (etcd for any other). Passwords are redacted. It
// never suggests a URL that Parse refuses.
func suggestion(raw string, extra []Scheme) string {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return ""
	}
	var cands []string
	if name, rest, ok := strings.Cut(raw, "://"); ok {
		if s := closestScheme(name, extra); s != "" {
			cands = append(cands, s+"://"+rest)
		}
	} else if name, rest, ok := strings.Cut(raw, ":"); ok && closestScheme(name, extra) != "" && !isPort(firstPort(rest)) {
		// SCHEME:/rest, SCHEME:rest: the slashes were lost, not a port.
		cands = append(cands, closestScheme(name, extra)+"://"+strings.TrimLeft(rest, "/"))
	} else if s := closestScheme(raw, extra); s != "" && !strings.ContainsAny(raw, "/:@.") {
		cands = append(cands, s+"://")
	} else {
		host := strings.TrimPrefix(raw, "//")
		scheme := "etcd"
		if _, port, err := net.SplitHostPort(lastHost(host)); err == nil && defaultPorts[port] != "" {
			scheme = defaultPorts[port]
		}
		cands = append(cands, scheme+"://"+host)
	}
	for _, c := range cands {
		if _, err := parse(c, extra); err != nil {
			continue
		}
		if r := Redact(c); r == c || validURL(r, extra) {
			return r
		}
	}
	return ""
}

// closestScheme returns the scheme name is, or is an alias or a
// misspelling of (at most one edit for names of up to four letters, two
// for longer ones), or "".
func closestScheme(name string, extra []Scheme) string {
	name = strings.ToLower(name)
	if name == "" || len(name) > 20 {
		return ""
	}
	names := make([]string, 0, len(schemes)+len(extra))
	for n := range schemes {
		names = append(names, n)
	}
	for _, x := range extra {
		names = append(names, strings.ToLower(x.Name))
	}
	if a, ok := aliases[name]; ok {
		for _, n := range names {
			if n == a {
				return a
			}
		}
	}
	best, bestD := "", 3
	for _, n := range names {
		limit := 1
		if len(n) > 4 {
			limit = 2
		}
		if d := editDistance(name, n); d <= limit && (d < bestD || (d == bestD && n < best)) {
			best, bestD = n, d
		}
	}
	return best
}

// firstPort returns what follows "SCHEME:" up to the first '/', ',' or
// '@': a port when raw was host:port.
func firstPort(rest string) string {
	if i := strings.IndexAny(rest, "/,@"); i >= 0 {
		return rest[:i]
	}
	return rest
}

func isPort(s string) bool {
	p, err := strconv.Atoi(s)
	return err == nil && p > 0 && p < 65536
}

// lastHost returns the last of comma-separated hosts.
func lastHost(hosts string) string {
	if i := strings.LastIndexByte(hosts, ','); i >= 0 {
		return hosts[i+1:]
	}
	if i := strings.IndexByte(hosts, '/'); i >= 0 {
		return hosts[:i]
	}
	return hosts
}

// editDistance is the optimal string alignment distance between a and
// b, in bytes: insertions, deletions, substitutions and transpositions of
// neighbours (etdc for etcd) cost one each.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// didYouMean returns " (did you mean S?)" for raw's suggestion S, or "".
func didYouMean(raw string, extra []Scheme) string {
	if s := suggestion(raw, extra); s != "" {
		return fmt.Sprintf(" (did you mean %s?)", s)
	}
	return ""
}

func validURL(raw string, extra []Scheme) bool {
	_, err := parse(raw, extra)
	return err == nil
}
