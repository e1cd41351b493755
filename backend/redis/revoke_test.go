package redis_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/redis"
	goredis "github.com/redis/go-redis/v9"
)

// scriptBlocker is a go-redis hook that, while on, fails the renewal
// and release scripts, and passes everything else, acquisitions
// included.
type scriptBlocker struct{ on atomic.Bool }

var errBlocked = errors.New("blocked by the test")

// kind tells the renewal script (every key a lease key) and the release
// script (keys in fours: lease, queue, waiting, woken) apart.
func (*scriptBlocker) kind(cmd goredis.Cmder) string {
	a := cmd.Args()
	if len(a) < 4 || !strings.EqualFold(fmt.Sprint(a[0]), "evalsha") {
		return ""
	}
	n, err := strconv.Atoi(fmt.Sprint(a[2]))
	if err != nil || n < 1 || len(a) < 3+n {
		return ""
	}
	keys := a[3 : 3+n]
	if n >= 2 && strings.HasPrefix(fmt.Sprint(keys[1]), redis.DefaultPrefix+"queue:") {
		return "release"
	}
	for _, k := range keys {
		if !strings.HasPrefix(fmt.Sprint(k), redis.DefaultPrefix+"lease:") {
			return ""
		}
	}
	return "renew"
}

func (s *scriptBlocker) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (s *scriptBlocker) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		return s.process(ctx, []goredis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}

func (s *scriptBlocker) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		return s.process(ctx, cmds, func() error { return next(ctx, cmds) })
	}
}

func (s *scriptBlocker) process(_ context.Context, cmds []goredis.Cmder, next func() error) error {
	if s.on.Load() {
		for _, c := range cmds {
			if k := s.kind(c); k == "renew" || k == "release" {
				c.SetErr(errBlocked)
				return errBlocked
			}
		}
	}
	return next()
}

// TestRevokeOfOldSessionKeepsNewTerms: a process whose renewals failed
// for a TTL starts a new session and revokes the old one in the
// background, retrying while the server is unreachable. A lease it takes
// under the new session before that revocation lands must keep its key:
// a revocation that deleted every key the process held would free the
// new term's lease while the process, its renewals now renewing nothing,
// went on extending that term's safe-until, and another process would
// take the lease with both acting.
func TestRevokeOfOldSessionKeepsNewTerms(t *testing.T) {
	srv := startQueueServer(t)
	c := newClient(t, srv.Addr(), "")
	blocker := &scriptBlocker{}
	c.AddHook(blocker)
	const ttl = 2 * time.Second
	b := newBackend(t, c, redis.Options{Config: backend.Config{TTL: ttl}})
	ctx := t.Context()

	first, err := b.Campaign(ctx, "old-session", baton.Candidate{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	blocker.on.Store(true) // renewals fail: the session expires
	select {
	case <-first.Done():
	case <-time.After(4 * ttl):
		t.Fatal("the first term outlived its session's failed renewals")
	}
	// The old session's revocation is retried in the background; the
	// next campaign takes a lease under a new session meanwhile.
	second, err := b.Campaign(ctx, "new-session", baton.Candidate{ID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	blocker.on.Store(false)

	// Through two TTLs of renewals, which cover the retries of the old
	// session's revocation (for a TTL after that session ended), the
	// second term is either over or its key still holds it.
	deadline := time.Now().Add(2 * ttl)
	for time.Now().Before(deadline) {
		v, err := srv.Do("GET", redis.KeysOf("", "new-session").Lease)
		held := err == nil && v != nil && strings.Contains(fmt.Sprint(v), " "+strconv.FormatUint(second.Token(), 10)+" ")
		if second.Err() == nil && !held {
			t.Fatalf("the term at token %d is live (safe until %s from now) while its key is %v (err %v): another process can take the lease",
				second.Token(), time.Until(second.SafeUntil()).Round(time.Millisecond), v, err)
		}
		time.Sleep(ttl / 20) // a poll of the key, not synchronisation
	}
	if second.Err() != nil {
		t.Fatalf("the second term ended: %v", second.Err())
	}
}
