package redis_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testserver"
	goredis "github.com/redis/go-redis/v9"
)

// leastPrivilege are the ACL rules docs/backends/redis.md gives a baton
// user: its commands, its keys and its channels.
const leastPrivilege = "+eval +evalsha +script|load +get +set +del +incr +pttl +pexpire +exists +time +zadd +zrem +zrange +zscore +wait +subscribe +publish +ping +info"

// TestLeastPrivilegeACL runs the conformance suite as a user given only
// what the docs list (and the same list is what the docs say), so that a
// command added to a script without a line in the docs fails here rather
// than for a team whose ACL follows them.
func TestLeastPrivilegeACL(t *testing.T) {
	doc, err := os.ReadFile("../../docs/backends/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "`"+leastPrivilege+"` on `~baton:*` and `&baton:released &baton:wake:*`") {
		t.Fatalf("docs/backends/redis.md does not give the ACL this test grants: %q on ~baton:* and &baton:released &baton:wake:*", leastPrivilege)
	}
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	admin := newClient(t, srv.Addr(), srv.Password())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rules := append([]any{"ACL", "SETUSER", "baton", "on", ">batonpw", "resetkeys", "~baton:*", "resetchannels", "&baton:released", "&baton:wake:*", "-@all"},
		toAny(strings.Fields(leastPrivilege))...)
	if err := admin.Do(ctx, rules...).Err(); err != nil {
		t.Fatal(err)
	}
	// A command outside the list is refused: the user is really limited.
	user := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Username: "baton", Password: "batonpw"})
	t.Cleanup(func() { _ = user.Close() })
	if err := user.Keys(ctx, "baton:*").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("KEYS as the limited user: %v, want NOPERM", err)
	}
	if err := user.Get(ctx, "other:x").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("GET of a key outside baton:* as the limited user: %v, want NOPERM", err)
	}
	batontest.Run(t, targetAs(srv, redis.Options{}, func(t testing.TB, addr string) *goredis.Client {
		c := goredis.NewClient(&goredis.Options{
			Addr: addr, Username: "baton", Password: "batonpw", ContextTimeoutEnabled: true,
			DialTimeout: 2 * time.Second, MaxRetries: -1,
		})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}))
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
