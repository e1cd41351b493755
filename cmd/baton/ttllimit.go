package main

import (
	"errors"
	"fmt"

	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/backend/etcd"
	"github.com/batonhq/baton/backend/zookeeper"
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
	)
	if !errors.As(err, &consulErr) && !errors.As(err, &etcdErr) && !errors.As(err, &zkErr) {
		return err
	}
	src, val := flagSource(fs, "ttl"), f.Value.String()
	if src == "--ttl" && !f.Changed {
		val = "unset (the backend's default)"
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("%s %s: %w", src, val, err)}
}
