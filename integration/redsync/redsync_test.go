// Package redsync_test checks that baton's Redis backend and redsync v4
// (the real library) share a lock: separate processes, baton candidates
// and redsync mutexes on one name, take turns through kill -9 and
// graceful releases, never overlap, and baton's tokens keep rising across
// redsync's turns.
package redsync_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	batonredis "github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/go-redsync/redsync/v4"
	rsgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredis "github.com/redis/go-redis/v9"
)

const childEnv = "BATON_REDSYNC_CHILD"

// TestMain runs the test binary as a child process when childEnv says so.
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	os.Exit(m.Run())
}

// ttl is the baton candidates' TTL; redsyncExpiry the mutexes' expiry.
const (
	ttl           = 2 * time.Second
	redsyncExpiry = 3 * time.Second
	beat          = 20 * time.Millisecond
)

// child is one process: a baton candidate or a redsync mutex on lease
// $LEASE of the server at $ADDR. It appends "ID ready 0 NANOS" before it
// contends, then "ID start TOKEN NANOS", "ID
// beat TOKEN NANOS" every 20 ms while it acts, and "ID end TOKEN NANOS"
// when it stops acting, to $LOG. SIGTERM stops it gracefully: a baton
// candidate resigns, a redsync mutex unlocks, after they stopped acting.
func child(mode string) int {
	addr, lease, id, logPath := os.Getenv("ADDR"), os.Getenv("LEASE"), os.Getenv("ID"), os.Getenv("LOG")
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var mu sync.Mutex
	note := func(what string, token uint64) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(f, "%s %s %d %d\n", id, what, token, time.Now().UnixNano())
		_ = f.Sync()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	client := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer client.Close()
	act := func(ctx context.Context, token uint64) {
		note("start", token)
		t := time.NewTicker(beat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				note("end", token)
				return
			case <-t.C:
				note("beat", token)
			}
		}
	}
	note("ready", 0)
	switch mode {
	case "baton":
		b, err := batonredis.New(ctx, client, batonredis.Options{Config: backend.Config{TTL: ttl}, PollInterval: 100 * time.Millisecond})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer b.Close(context.Background())
		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: lease, Candidate: baton.Candidate{ID: id}})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		err = e.Run(ctx, func(ctx context.Context, t baton.Term) error {
			act(ctx, t.Token())
			return ctx.Err()
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "redsync":
		rs := redsync.New(rsgoredis.NewPool(client))
		m := rs.NewMutex(batonredis.KeysOf("", lease).Lease, redsync.WithExpiry(redsyncExpiry),
			redsync.WithTries(1<<30), redsync.WithRetryDelay(50*time.Millisecond))
		if err := m.LockContext(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		actx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); act(actx, 0) }()
		// Extend a third of the expiry before it runs out; stop acting
		// before the mutex's validity ends if an extension fails.
		for {
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(m.Until()) - redsyncExpiry/3):
				if ok, err := m.ExtendContext(ctx); ok && err == nil {
					continue
				}
			}
			break
		}
		cancel()
		<-done
		if _, err := m.UnlockContext(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, "unlock:", err)
		}
		return 0
	}
	return 2
}

// event is a line of the log.
type event struct {
	id, what string
	token    uint64
	at       time.Time
}

func readLog(t *testing.T, path string) []event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.Fields(sc.Text())
		if len(p) != 4 {
			continue
		}
		tok, _ := strconv.ParseUint(p[2], 10, 64)
		ns, _ := strconv.ParseInt(p[3], 10, 64)
		out = append(out, event{id: p[0], what: p[1], token: tok, at: time.Unix(0, ns)})
	}
	return out
}

type span struct {
	id          string
	token       uint64
	first, last time.Time
}

// spans returns each process's acting span, from its start to its last
// line, in order of start.
func spans(evs []event) []span {
	by := map[string]*span{}
	var order []string
	for _, e := range evs {
		if e.what == "ready" {
			continue
		}
		s := by[e.id]
		if s == nil {
			s = &span{id: e.id, token: e.token, first: e.at}
			by[e.id] = s
			order = append(order, e.id)
		}
		s.last = e.at
	}
	var out []span
	for _, id := range order {
		out = append(out, *by[id])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].first.Before(out[j].first) })
	return out
}

func TestBatonAndRedsyncTakeTurns(t *testing.T) {
	srv := testserver.StartRedis(t, testserver.RedisOptions{})
	logPath := filepath.Join(t.TempDir(), "acts.log")
	if err := os.WriteFile(logPath, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	procs := map[string]*exec.Cmd{}
	start := func(mode, id string) {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+mode, "ADDR="+srv.Addr(), "LEASE=interop", "ID="+id, "LOG="+logPath)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[id] = cmd
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	started := func(id string) {
		t.Helper()
		testkit.Eventually(t, 60*time.Second, id+" acting", func() bool {
			for _, e := range readLog(t, logPath) {
				if e.id == id && e.what == "start" {
					return true
				}
			}
			return false
		})
	}
	// contending waits until id is up and the holder has acted ten more
	// times since: id has had its chance to take the lock.
	contending := func(id, holder string) {
		t.Helper()
		testkit.Eventually(t, 60*time.Second, id+" contending while "+holder+" acts", func() bool {
			ready, beats := false, 0
			for _, e := range readLog(t, logPath) {
				switch {
				case e.id == id && e.what == "ready":
					ready = true
				case ready && e.id == holder && e.what == "beat":
					beats++
				}
			}
			return beats >= 10
		})
	}
	kill := func(id string) { _ = procs[id].Process.Kill(); _ = procs[id].Wait() }
	term := func(id string) {
		_ = procs[id].Process.Signal(syscall.SIGTERM)
		if err := procs[id].Wait(); err != nil {
			t.Errorf("%s after SIGTERM: %v", id, err)
		}
	}

	start("baton", "baton-1")
	started("baton-1")
	start("redsync", "redsync-1")
	contending("redsync-1", "baton-1")
	kill("baton-1") // kill -9: its key expires a TTL after its last renewal
	started("redsync-1")
	start("baton", "baton-2")
	contending("baton-2", "redsync-1")
	term("redsync-1") // graceful: Unlock deletes the key
	started("baton-2")
	start("redsync", "redsync-2")
	contending("redsync-2", "baton-2")
	term("baton-2") // graceful: resign deletes the key
	started("redsync-2")
	start("baton", "baton-3")
	contending("baton-3", "redsync-2")
	kill("redsync-2") // kill -9: the mutex expires
	started("baton-3")
	term("baton-3")

	sp := spans(readLog(t, logPath))
	want := []string{"baton-1", "redsync-1", "baton-2", "redsync-2", "baton-3"}
	var got []string
	for _, s := range sp {
		got = append(got, s.id)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("holders in order %v; want %v", got, want)
	}
	var lastToken uint64
	for i, s := range sp {
		if i > 0 && !s.first.After(sp[i-1].last) {
			t.Errorf("%s started %s before %s's last act", s.id, sp[i-1].last.Sub(s.first), sp[i-1].id)
		}
		if strings.HasPrefix(s.id, "baton") {
			if s.token <= lastToken {
				t.Errorf("%s has token %d, not above the previous baton term's %d", s.id, s.token, lastToken)
			}
			lastToken = s.token
		}
		if i > 0 {
			t.Logf("%s → %s: %s", sp[i-1].id, s.id, s.first.Sub(sp[i-1].last).Round(time.Millisecond))
		}
	}
}
