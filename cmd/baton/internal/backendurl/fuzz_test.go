package backendurl

import (
	"net"
	"net/url"
	"path"
	"strings"
	"testing"
)

// FuzzParseBackend: any backend URL (baton's --backend) gets a spec or an
// error that says what a valid URL looks like, never a panic; and a URL it
// accepts names only hosts that a client can dial, so that no bad input
// gets past the usage check (exit 2) to fail as a connection error at run
// time (exit 1 or 3). It covers every scheme's parser (consul.ParseURL and the zk parser
// included); none connects.
func FuzzParseBackend(f *testing.F) {
	for _, seed := range []string{
		"etcd://127.0.0.1:2379", "etcd://a:1,b:2", "memory://", "raft://", "agent://127.0.0.1:8790",
		"zk://127.0.0.1:2181/services/billing", "zk://u:p@h1,h2:2182/?ca-file=ca.pem",
		"zk://h:2181/a//b", "zk://h?tls=maybe", "zk://[::1]:2181/x",
		"consul://127.0.0.1:8500", "consul://h/svc/?token-file=t&dc=eu", "consul://h?token=x",
		"consul://", "consul://h:99999", "%zz://", "zk://h%zz", "",
		"etcd://%zz", "etcd://[fe80::1%lo]:2379", "etcd://[fe80::1%25lo]:2379", "etcd://u:p%zz@h:2379",
		"etcd://user:pass@h1:2379,h2", "zk://h/x?ca-file=%zz", "consul://h/%zz", "agent://h%41:1",
		"etcd://[::1", "etcd://[::1]x", "etcd://hé:2379", "etcd://::1", "agent://[::1]:8790",
		"agent:///run/baton/agent.sock", "agent://tok@/run/x.sock", "agent:///", "agent:///a/../b", "agent://tok@10.0.0.1:8790",
		"postgres://u:pw@h1:5432,h2/db?sslmode=verify-full&baton_schema=s", "postgresql://", "postgres://u:pw%zz@h",
		"postgres://u@h/db?password=pw&sslmode=x", "postgres://h/db?baton_listen=postgres://u:pw@d/db", "postgres://h:99999",
		"postgres://u:pw@[::1]:5432/db?baton_schema=BAD", "postgres://h/db?baton_create=no&baton_listen=off", "postgres://u:p@h#x",
		"dynamodb://baton-leases?region=eu-west-1&poll=2s", "dynamodb://k:secretpw@t", "dynamodb://t:1?endpoint=%zz", "DynamoDB://ab",
		"redis://u:pw@h:6379/2?baton_prefix=a:", "rediss://h", "redis://h1,h2", "redis+sentinel://s1,s2:26380/m/1",
		"redis+sentinel:///m", "redis+cluster://h:7000", "redis://h:99999", "redis://[::1]:6379/0?baton_replicas=x",
		"redis+sentinel://u:secret@s/m?x=1", "redis://u:p%zz@h", "rediss+sentinel://[fe80::1%25lo]/m", "redis://h/0#x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		spec, err := Parse(raw)
		if err == nil && spec == nil {
			t.Fatalf("Parse(%q): no spec and no error", raw)
		}
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("Parse(%q): empty error", raw)
			}
			if pw := redisPassword(raw); len(pw) >= 4 && strings.Contains(err.Error(), pw) {
				t.Fatalf("Parse(%q): the error holds the password %q: %v", raw, pw, err)
			}
			if pw := postgresPassword(raw); len(pw) >= 4 && strings.Contains(err.Error(), pw) && !strings.Contains(Redact(raw), pw) {
				t.Fatalf("Parse(%q): the error holds the password %q: %v", raw, pw, err)
			}
			return
		}
		if spec.Scheme == "agent" && spec.Socket != "" {
			if len(spec.Hosts) != 0 || !path.IsAbs(spec.Socket) || path.Clean(spec.Socket) != spec.Socket {
				t.Fatalf("Parse(%q) accepted agent socket %q (hosts %q): want one absolute, clean path", raw, spec.Socket, spec.Hosts)
			}
		} else if u, perr := url.Parse(raw); spec.Scheme == "agent" && perr == nil && u.User != nil && u.User.Username() != "" {
			if len(spec.Hosts) != 1 || !IsLoopback(spec.Hosts[0]) {
				t.Fatalf("Parse(%q) accepted a token for agent hosts %q: it would cross the network in cleartext", raw, spec.Hosts)
			}
		}
		switch spec.Scheme {
		case "etcd", "zk", "consul", "agent", "redis", "rediss", "redis+sentinel", "rediss+sentinel":
			if len(spec.Hosts) == 0 && spec.Socket == "" {
				t.Fatalf("Parse(%q) accepted a %s URL without a host", raw, spec.Scheme)
			}
		}
		for _, h := range spec.Hosts {
			// The form the clients build: etcd's gRPC target, Consul's
			// and the agent client's http://HOST:PORT.
			hp := net.JoinHostPort(h, "1")
			u, err := url.Parse("http://" + hp)
			if err != nil || u.Hostname() != h {
				t.Fatalf("Parse(%q) accepted host %q, which a client cannot dial: %v", raw, h, err)
			}
			if _, err := url.Parse("dns:///etcd-endpoints/" + hp); err != nil {
				t.Fatalf("Parse(%q) accepted host %q, which the etcd client cannot dial: %v", raw, h, err)
			}
		}
	})
}

// postgresPassword returns the password of a postgres:// URL's user
// information, as pgx reads it (the user information ends at the first @
// before any /), or "".
func postgresPassword(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !strings.HasPrefix(strings.ToLower(scheme), "postgres") {
		return ""
	}
	i := strings.IndexAny(rest, "@/")
	if i < 0 || rest[i] != '@' {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:i], ":")
	if p, err := url.PathUnescape(pw); err == nil {
		return p
	}
	return pw
}

// redisPassword returns the password of a Redis URL's user information
// (before the first / after the scheme, up to the last @), or "".
func redisPassword(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !strings.HasPrefix(strings.ToLower(scheme), "redis") {
		return ""
	}
	authority, _, _ := strings.Cut(rest, "/")
	i := strings.LastIndex(authority, "@")
	if i < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(authority[:i], ":")
	return pw
}
