package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/backend/zookeeper"
	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/spf13/pflag"
)

// namingTTL returns err, a configuration error, prefixed with the flag (or
// environment variable) and value of --ttl when it is a server's refusal
// of the TTL, found only once the server was asked: Consul's session TTL
// bounds, etcd's lease TTL limit, the session timeout ZooKeeper
// negotiated. Limits known beforehand are checked with the other flags,
// and name --ttl already.
func namingTTL(fs *pflag.FlagSet, err error) error {
	f := fs.Lookup("ttl")
	if f == nil {
		return err
	}
	var (
		consulErr *consul.SessionTTLError
		etcdErr   *etcd.TTLError
		zkErr     *zookeeper.SessionTimeoutError
		raftErr   *raft.TTLError
	)
	if !errors.As(err, &consulErr) && !errors.As(err, &etcdErr) && !errors.As(err, &zkErr) && !errors.As(err, &raftErr) {
		return err
	}
	src, val := flagSource(fs, "ttl"), f.Value.String()
	if src == "--ttl" && !f.Changed {
		val = "unset (the backend's default)"
		if b := fs.Lookup("backend"); b != nil {
			if scheme, _, ok := strings.Cut(b.Value.String(), "://"); ok {
				val = fmt.Sprintf("unset (the default TTL of %s://, %s)", strings.ToLower(scheme), backendurl.DefaultTTL(scheme))
			}
		}
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("%s %s: %w", src, val, err)}
}

// raftTTLFloor returns the problem with ttl (0: raft's default) on raft://
// or agent://, named src, or "" when it is at least raft.MinTTL at the
// heartbeat timeout baton's members run at (raft.DefaultHeartbeatTimeout:
// the CLI does not change it): below that, the renewal window is shorter
// than a heartbeat timeout, and a pause or late reply that raft rides out
// without an election would end every term (raft.CheckTiming says why).
func raftTTLFloor(src string, ttl time.Duration) string {
	err := raft.CheckTiming(backend.Config{TTL: ttl}, raft.DefaultHeartbeatTimeout)
	var te *raft.TTLError
	if !errors.As(err, &te) {
		return ""
	}
	return fmt.Sprintf("%s %s: below %s, the shortest TTL the embedded raft group can honour: "+
		"its renewal window (TTL less the renew interval TTL/3 and drift margin TTL/10, %s here) must be at least raft's heartbeat timeout (%s), "+
		"or a pause or a late reply that raft rides out without an election ends every term; use --ttl %s or more (raft's default is %s)",
		src, ttl, te.Min, te.Window.Round(time.Millisecond), te.HeartbeatTimeout, te.Min, raft.DefaultTTL)
}

// ttlInForce names the TTL that spec's backend runs at with ttl (0: its
// default), for messages: "--ttl 3s" (or "BATON_TTL 3s") when given, else
// e.g. "the default TTL of raft://, 5s".
func ttlInForce(fs *pflag.FlagSet, spec *backendurl.Spec, ttl time.Duration) string {
	if ttl != 0 {
		return fmt.Sprintf("%s %s", flagSource(fs, "ttl"), ttl)
	}
	return fmt.Sprintf("the default TTL of %s://, %s", spec.Scheme, spec.TTL(0))
}
