package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
	"github.com/batonhq/baton/supervise"
)

// Environment of the test binary in child-helper mode, which the
// multi-process tests run under `baton run`.
const (
	childEnv     = "BATON_TEST_CHILD" // "1": act as the supervised child; "hb": heartbeatMain; "get": getMain
	childFileEnv = "BATON_TEST_FILE"  // the shared event file
)

// batonBin is the baton binary TestMain built, for multi-process tests.
var batonBin string

// prebuiltEnv names a baton binary for the multi-process tests to use
// instead of building one, e.g. when the test binary (go test -c) runs as a
// plain user: go test -c -race -o /tmp/t/baton.test . && go build -o
// /tmp/t/baton . && setpriv --reuid=USER ... env BATON_TEST_BATON=/tmp/t/baton
// /tmp/t/baton.test -test.run 'TestRunStoppedGuard'.
const prebuiltEnv = "BATON_TEST_BATON"

func TestMain(m *testing.M) {
	// In-process `run` tests start their commands under guards: this
	// binary again.
	supervise.GuardMain()
	switch os.Getenv(childEnv) {
	case "1":
		os.Exit(childMain())
	case "hb":
		os.Exit(heartbeatMain())
	case "get":
		os.Exit(getMain())
	}
	// A race-enabled guard (the in-process tests' commands run under this
	// binary) would otherwise sleep a second at exit, ThreadSanitizer's
	// default, which baton waits for.
	os.Setenv("GORACE", "atexit_sleep_ms=0")
	dir, err := os.MkdirTemp("", "baton-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	batonBin = filepath.Join(dir, "baton")
	if bin := os.Getenv(prebuiltEnv); bin != "" {
		// A test binary run as another user (a plain user, with no Go
		// toolchain or module cache of its own) uses a baton built for it.
		batonBin = bin
	} else {
		build := exec.Command("go", "build", "-o", batonBin, ".")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "building baton for the multi-process tests: %v\n", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	testserver.StopSharedKubeAPIServer()
	testserver.StopSharedPostgres()
	os.RemoveAll(dir)
	os.Exit(code)
}

// recordStart appends this child's "start TOKEN PID UNIXNANO OTHERS_ALIVE
// HOLDER" line to file, where OTHERS_ALIVE counts the children that started
// before it and are still alive, and returns its token.
func recordStart(file string) (token string) {
	token = os.Getenv("BATON_TOKEN")
	others := 0
	for _, ev := range readEvents(file) {
		if ev.kind == "start" && ev.pid != os.Getpid() && isOurChild(ev.pid) {
			others++
		}
	}
	appendLine(file, fmt.Sprintf("start %s %d %d %d %s", token, os.Getpid(), time.Now().UnixNano(), others, os.Getenv("BATON_HOLDER")))
	return token
}

// childMain is the supervised command of the multi-process tests. It
// appends "start TOKEN PID UNIXNANO OTHERS_ALIVE HOLDER" to the shared file,
// where OTHERS_ALIVE counts the children that started before it and are
// still alive, then idles until SIGTERM, when it appends
// "stop TOKEN PID UNIXNANO" and exits 0.
func childMain() int {
	file := os.Getenv(childFileEnv)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	token := recordStart(file)
	<-term
	appendLine(file, fmt.Sprintf("stop %s %d %d", token, os.Getpid(), time.Now().UnixNano()))
	return 0
}

// appendLine writes line with one write(2) on an O_APPEND file, so that the
// lines of concurrent children never interleave.
func appendLine(file, line string) {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
}

type event struct {
	kind   string // start or stop
	token  uint64
	pid    int
	at     int64 // unix nanoseconds
	others int   // start only
	holder string
}

func readEvents(file string) []event {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var evs []event
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		ev := event{kind: f[0]}
		ev.token, _ = strconv.ParseUint(f[1], 10, 64)
		ev.pid, _ = strconv.Atoi(f[2])
		ev.at, _ = strconv.ParseInt(f[3], 10, 64)
		if ev.kind == "start" && len(f) >= 6 {
			ev.others, _ = strconv.Atoi(f[4])
			ev.holder = f[5]
		}
		evs = append(evs, ev)
	}
	return evs
}

// procStat returns the state and parent of pid from /proc/PID/stat.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err == nil
}

// alive reports whether pid runs and is not a zombie: PID 1 in a container
// may never reap orphans.
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// isOurChild reports whether pid is alive and runs this same binary, so that
// a recycled PID is not mistaken for a child.
func isOurChild(pid int) bool {
	if !alive(pid) {
		return false
	}
	self, err1 := os.Readlink("/proc/self/exe")
	exe, err2 := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err1 == nil && err2 == nil && self == exe
}

// result is one in-process run of the App.
type result struct {
	code           int
	stdout, stderr string
}

// runApp runs args in-process with env as the whole environment.
func runApp(ctx context.Context, env map[string]string, args ...string) result {
	var stdout, stderr testserver.SyncBuffer
	app := &App{
		Stdout: &stdout,
		Stderr: &stderr,
		LookupEnv: func(k string) (string, bool) {
			v, ok := env[k]
			return v, ok
		},
		Environ: func() []string {
			var kv []string
			for k, v := range env {
				kv = append(kv, k+"="+v)
			}
			return append(kv, "PATH="+os.Getenv("PATH"))
		},
		Hostname: func() (string, error) { return "testhost", nil },
	}
	code := app.Main(ctx, args)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// etcdURL starts a test etcd and returns its etcd:// backend URL.
func etcdURL(t *testing.T) string { return "etcd://" + testserver.StartEtcd(t).Endpoint() }

// zkURL starts a standalone test ZooKeeper and returns its zk:// backend URL
// with root.
func zkURL(t *testing.T, root string) string {
	return "zk://" + testserver.StartZooKeeper(t, testserver.ZooKeeperOptions{}).Addr() + root
}

// consulURL starts a test Consul agent and returns its consul:// backend URL
// with prefix.
func consulURL(t *testing.T, prefix string) string {
	return "consul://" + testserver.StartConsul(t, testserver.ConsulOptions{}).Addr() + prefix
}
