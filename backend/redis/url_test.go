package redis_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/redis"
)

func TestParseURL(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("filepw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := redis.ParseURL("rediss://alice:s3cret@cache.internal:6380/2?baton_prefix=app:&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if o := c.Client; o == nil || o.Addr != "cache.internal:6380" || o.Username != "alice" || o.Password != "s3cret" || o.DB != 2 || o.TLSConfig == nil || !o.ContextTimeoutEnabled {
		t.Errorf("rediss:// client options: %+v", o)
	}
	if c.Options.Prefix != "app:" || c.Options.Replicas != 0 {
		t.Errorf("options: %+v", c.Options)
	}
	c, err = redis.ParseURL("redis+sentinel://bob:pw@s1,s2:26380,[::1]/mymaster/3?password_file=" + pwFile + "&baton_pubsub=off")
	if err != nil {
		t.Fatal(err)
	}
	if f := c.Failover; f == nil || f.MasterName != "mymaster" || f.DB != 3 || f.Username != "bob" || f.Password != "filepw" ||
		strings.Join(f.SentinelAddrs, " ") != "s1:26379 s2:26380 [::1]:26379" {
		t.Errorf("sentinel options: %+v", f)
	}
	if c.Options.Replicas != 1 || !c.Options.NoPubSub {
		t.Errorf("a Sentinel URL's options: %+v; want Replicas 1 by default, NoPubSub", c.Options)
	}
	if c, err := redis.ParseURL("redis://h/0?baton_grant=on"); err != nil || !c.Options.Grant {
		t.Errorf("baton_grant=on: %+v, %v", c.Options, err)
	}
	if _, err := redis.ParseURL("redis://h/0?baton_grant=yes"); err == nil || !strings.Contains(err.Error(), "baton_grant=yes") {
		t.Errorf("baton_grant=yes: %v, want an error naming it", err)
	}
	if c, err := redis.ParseURL("redis+sentinel://s1/m?baton_replicas=0"); err != nil || c.Options.Replicas != 0 {
		t.Errorf("baton_replicas=0 on a Sentinel URL: %+v, %v", c.Options, err)
	}
	for raw, want := range map[string]string{
		"redis://h1:6379,h2:6379/0":              "Redis Cluster is not supported",
		"redis+cluster://h1:7000":                "Redis Cluster is not supported",
		"redis+sentinel:///mymaster":             "no sentinel addresses",
		"redis+sentinel://s1:26379":              "no master name",
		"redis+sentinel://s1:99999/m":            "port",
		"redis://h/0?baton_replicas=x":           "baton_replicas=x",
		"redis://h/0?baton_colour=red":           "unknown parameter",
		"redis://u:hunter22@h/0?bogus=1":         "bogus",
		"redis://h/0?password_file=/nonexistent": "password_file",
		"memcached://h":                          "not a Redis URL",
		"redis+sentinel://u:hunter22@s/m?x=1":    "unknown parameter",
	} {
		_, err := redis.ParseURL(raw)
		var ce *baton.ConfigError
		if err == nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseURL(%q) = %v; want a *baton.ConfigError saying %q", raw, err, want)
			continue
		}
		if strings.Contains(err.Error(), "hunter22") {
			t.Errorf("ParseURL(%q)'s error shows the password: %v", raw, err)
		}
	}
}
