package main

import (
	"strings"
	"testing"
)

// FuzzParseBackend: any --backend value gets a spec or an error that says
// what a valid URL looks like, never a panic. It covers every scheme's
// parser (consul.ParseURL and the zk parser included); none connects.
func FuzzParseBackend(f *testing.F) {
	for _, seed := range []string{
		"etcd://127.0.0.1:2379", "etcd://a:1,b:2", "memory://", "raft://", "agent://127.0.0.1:8790",
		"zk://127.0.0.1:2181/services/billing", "zk://u:p@h1,h2:2182/?ca-file=ca.pem",
		"zk://h:2181/a//b", "zk://h?tls=maybe", "zk://[::1]:2181/x",
		"consul://127.0.0.1:8500", "consul://h/svc/?token-file=t&dc=eu", "consul://h?token=x",
		"consul://", "consul://h:99999", "%zz://", "zk://h%zz", "",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		spec, err := parseBackend(raw)
		if err == nil && spec == nil {
			t.Fatalf("parseBackend(%q): no spec and no error", raw)
		}
		if err != nil && strings.TrimSpace(err.Error()) == "" {
			t.Fatalf("parseBackend(%q): empty error", raw)
		}
	})
}
