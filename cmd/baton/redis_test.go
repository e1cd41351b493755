package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// redisURL starts a redis-server with a password for the test and returns
// a redis:// URL of it that reads the password from a file.
func redisURL(t *testing.T) string {
	srv := testserver.StartRedis(t, testserver.RedisOptions{Password: "s3cret-pw"})
	pw := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(pw, []byte("s3cret-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.ShareWith(t, pw)
	return "redis://" + srv.Addr() + "/0?password_file=" + pw
}

// redisSentinelURL starts a primary, a replica and three sentinels and
// returns a redis+sentinel:// URL of them (baton_replicas defaults to 1:
// every acquisition and renewal waits for the replica).
func redisSentinelURL(t *testing.T) string {
	p := testserver.StartRedis(t, testserver.RedisOptions{})
	r := testserver.StartRedis(t, testserver.RedisOptions{ReplicaOf: p.Addr()})
	testkit.Eventually(t, 30*time.Second, "the replica in sync", func() bool {
		v, _ := r.Do("INFO", "replication")
		s, _ := v.(string)
		return strings.Contains(s, "master_link_status:up")
	})
	s := testserver.StartSentinels(t, p, testserver.SentinelOptions{})
	return "redis+sentinel://" + strings.Join(s.Addrs(), ",") + "/" + s.MasterName
}
