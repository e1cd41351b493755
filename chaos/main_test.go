package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// Bad input exits 2 with a message naming what is wrong, before anything
// is started.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--backend is required"},
		{[]string{"--backend", "mysql"}, `backend "mysql": want one of`},
		{[]string{"--backend", "etcd", "--kinds", "raft-leader"}, `fault kind "raft-leader": the etcd backend takes`},
		{[]string{"--backend", "raft", "--candidates", "2"}, "raft needs at least 3"},
		{[]string{"--backend", "etcd", "--ttl", "100ms"}, "ttl 100ms: want at least 1s"},
		{[]string{"--backend", "etcd", "--broken", "slow"}, `broken build "slow"`},
		{[]string{"--backend", "etcd", "--min-availability", "99.9"}, "--min-availability 99.9: want a fraction"},
		{[]string{"--backend", "etcd", "--faults", "x"}, `invalid argument "x"`},
		{[]string{"--backend", "etcd", "--pgbouncer"}, "only the postgres backend goes through PgBouncer"},
		{[]string{"check", "/nonexistent"}, "no such file"},
	} {
		args := tc.args
		if len(args) == 0 || args[0] != "check" {
			args = append(args, "--dir", t.TempDir())
		}
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d; stderr: %s", tc.args, code, exitUsage, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q does not say %q", tc.args, stderr.String(), tc.want)
		}
	}
}

// The command a report gives reproduces the run: a run of processes
// taking turns says so.
func TestCommandReproducesTurns(t *testing.T) {
	o := &options{}
	o.cfg.Backend, o.cfg.Seed, o.cfg.Faults, o.cfg.Candidates, o.cfg.Turns = "consul", 29, 1000, 3, 3
	o.cfg.TermMax = 8 * time.Second
	if got := o.command(); !strings.Contains(got, "--turns 3 --term-max 8s") {
		t.Errorf("command() = %q, want it to name --turns 3 --term-max 8s", got)
	}
	o.cfg.Turns, o.cfg.TermMax = 1, 0
	if got := o.command(); strings.Contains(got, "--turns") {
		t.Errorf("command() = %q for a run without turns, want no --turns", got)
	}
}
