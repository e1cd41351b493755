package kubernetes_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// buildElectors builds internal/batonelector and internal/clientgoelector
// into dir, with -race when the tests have it.
func buildElectors(t *testing.T) (batonBin, clientGoBin string) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./internal/batonelector", "./internal/clientgoelector")
	cmd := exec.Command("go", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return filepath.Join(dir, "batonelector"), filepath.Join(dir, "clientgoelector")
}

// event is one line an elector program printed: "UNIXNANO KIND ID ARGS...".
type event struct {
	at   time.Time
	kind string
	args []string
}

// electorProc is one elector program the test started.
type electorProc struct {
	id     string
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned
	err    error         // Wait's result, set before exited is closed
	stderr *testserver.SyncBuffer

	mu     sync.Mutex
	events []event
}

// startElector starts bin with args, as id, and reads its events. The
// test's clean-up kills it if it still runs.
func startElector(t *testing.T, id, bin string, args ...string) *electorProc {
	t.Helper()
	p := &electorProc{id: id, exited: make(chan struct{}), stderr: &testserver.SyncBuffer{}}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", id, err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		p.read(t, out)
	}()
	go func() {
		<-read
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("%s's events:\n%s\n%s's stderr:\n%s", id, p.String(), id, p.stderr.String())
		}
	})
	return p
}

func (p *electorProc) read(t *testing.T, r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			t.Errorf("%s printed %q, not UNIXNANO KIND ID ...", p.id, sc.Text())
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || f[2] != p.id {
			t.Errorf("%s printed %q, not UNIXNANO KIND %s ...", p.id, sc.Text(), p.id)
			continue
		}
		p.mu.Lock()
		p.events = append(p.events, event{at: time.Unix(0, ns), kind: f[1], args: f[3:]})
		p.mu.Unlock()
	}
}

// find returns the first event of kind whose args start with args.
func (p *electorProc) find(kind string, args ...string) (event, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range p.events {
		if ev.kind == kind && len(ev.args) >= len(args) && slices.Equal(ev.args[:len(args)], args) {
			return ev, true
		}
	}
	return event{}, false
}

// await waits up to d for an event of kind whose args start with args.
func (p *electorProc) await(t *testing.T, d time.Duration, kind string, args ...string) event {
	t.Helper()
	var ev event
	testkit.Eventually(t, d, fmt.Sprintf("%s to print %q %q", p.id, kind, args), func() bool {
		var ok bool
		ev, ok = p.find(kind, args...)
		return ok
	})
	return ev
}

// none fails if p printed an event of kind.
func (p *electorProc) none(t *testing.T, kind, why string) {
	t.Helper()
	if ev, ok := p.find(kind); ok {
		t.Fatalf("%s printed %s at %v %v, %s", p.id, kind, ev.at, ev.args, why)
	}
}

func (p *electorProc) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, ev := range p.events {
		fmt.Fprintf(&b, "  %s %s %v\n", ev.at.Format(time.RFC3339Nano), ev.kind, ev.args)
	}
	return b.String()
}

// stop sends SIGTERM and waits for p to exit 0.
func (p *electorProc) stop(t *testing.T, d time.Duration) time.Time {
	t.Helper()
	at := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.id, err)
	}
	select {
	case <-p.exited:
	case <-time.After(d):
		t.Fatalf("%s did not exit within %s of SIGTERM", p.id, d)
	}
	if p.err != nil {
		t.Fatalf("%s exited with %v after SIGTERM; stderr:\n%s", p.id, p.err, p.stderr.String())
	}
	return at
}

// kill kills p with SIGKILL and waits for it to be gone.
func (p *electorProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s: %v", p.id, err)
	}
	<-p.exited
}

// leaseVersion is one version of the Lease, as a watch reported it.
type leaseVersion struct {
	rv          string
	holder      string
	transitions int32
	duration    time.Duration
	renew       time.Time
}

// leaseHistory follows every version of one Lease through a watch of its
// own, as the admin.
type leaseHistory struct {
	mu       sync.Mutex
	versions []leaseVersion
}

func followLease(t *testing.T, cs k8s.Interface, ns, name string) *leaseHistory {
	t.Helper()
	h := &leaseHistory{}
	ctx, cancel := context.WithCancel(context.Background())
	leases := cs.CoordinationV1().Leases(ns)
	watchFrom := func(rv string) (watch.Interface, error) {
		return leases.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(), ResourceVersion: rv})
	}
	w, err := watchFrom("")
	if err != nil {
		t.Fatalf("watch Lease %s/%s: %v", ns, name, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rv := ""
		for {
			for ev := range w.ResultChan() {
				l, ok := ev.Object.(*coordinationv1.Lease)
				if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
					if ev.Type == watch.Error && ctx.Err() == nil {
						t.Errorf("the test's watch of the Lease failed: %v", ev.Object)
					}
					continue
				}
				rv = l.ResourceVersion
				v := leaseVersion{rv: l.ResourceVersion}
				if l.Spec.HolderIdentity != nil {
					v.holder = *l.Spec.HolderIdentity
				}
				if l.Spec.LeaseTransitions != nil {
					v.transitions = *l.Spec.LeaseTransitions
				}
				if l.Spec.LeaseDurationSeconds != nil {
					v.duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
				}
				if l.Spec.RenewTime != nil {
					v.renew = l.Spec.RenewTime.Time
				}
				h.mu.Lock()
				h.versions = append(h.versions, v)
				h.mu.Unlock()
			}
			w.Stop()
			if ctx.Err() != nil {
				return
			}
			// The server ended the watch: go on from the last version.
			if w, err = watchFrom(rv); err != nil {
				t.Errorf("watch Lease %s/%s again: %v", ns, name, err)
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("the Lease's versions:\n%s", h)
		}
	})
	return h
}

func (h *leaseHistory) snapshot() []leaseVersion {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.versions)
}

// count returns how many versions name holder.
func (h *leaseHistory) count(holder string) int {
	n := 0
	for _, v := range h.snapshot() {
		if v.holder == holder {
			n++
		}
	}
	return n
}

// last returns the last version that names holder.
func (h *leaseHistory) last(holder string) (leaseVersion, bool) {
	vs := h.snapshot()
	for i := len(vs) - 1; i >= 0; i-- {
		if vs[i].holder == holder {
			return vs[i], true
		}
	}
	return leaseVersion{}, false
}

func (h *leaseHistory) String() string {
	var b strings.Builder
	for _, v := range h.snapshot() {
		fmt.Fprintf(&b, "  rv %s holder %q transitions %d duration %s renew %s\n", v.rv, v.holder, v.transitions, v.duration, v.renew.Format(time.RFC3339Nano))
	}
	return b.String()
}

// renewals waits until holder has written the Lease n more times than it
// had when called.
func (h *leaseHistory) renewals(t *testing.T, holder string, n int) {
	t.Helper()
	from := h.count(holder)
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("%s to renew the Lease %d times", holder, n), func() bool { return h.count(holder) >= from+n })
}

func tokenArg(t *testing.T, p *electorProc, ev event, i int) uint64 {
	t.Helper()
	if len(ev.args) <= i {
		t.Fatalf("%s's %s event has no token: %v", p.id, ev.kind, ev.args)
	}
	v, err := strconv.ParseUint(ev.args[i], 10, 64)
	if err != nil {
		t.Fatalf("%s's %s event: token %q: %v", p.id, ev.kind, ev.args[i], err)
	}
	return v
}

// TestClientGoProcessesShareLease runs baton and client-go's LeaderElector
// as separate processes on one Lease, leadership going baton → client-go →
// baton through kill -9 of the holder and then again through graceful
// release (SIGTERM):
//
//   - the leading spans never overlap, a killed holder's span counting up
//     to the last moment it could have acted had it been cut off rather
//     than killed (its last write's renewTime + its lease duration, past
//     its safe-until);
//   - a killed holder is taken over only a full lease duration after its
//     last write (both the Lease's renewTime stamps, on one host's clock);
//   - baton's fencing tokens rise across every term, client-go's included
//     (baton's view of a client-go term gives that term's token);
//   - each side's view names the other: client-go's OnNewLeader names the
//     baton holder, baton's Elector.WatchLeader the client-go holder, and
//     a baton observer that never campaigns hears every holder in turn.
func TestClientGoProcessesShareLease(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	batonBin, clientGoBin := buildElectors(t)
	const lease = "interop"
	ns := grantLeases(t, srv, "baton-interop")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, srv.Kubeconfig(srv.Host(), testserver.KubeUser, ns), 0o600); err != nil {
		t.Fatal(err)
	}
	admin, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeAdminUser))
	if err != nil {
		t.Fatal(err)
	}
	hist := followLease(t, admin, ns, lease)

	// Both sides at a 3 s lease: baton's TTL (renewed every 1 s) and
	// client-go's LeaseDuration (renewed every 0.5 s, given up after 2 s).
	const ttl = 3 * time.Second
	startBaton := func(id string, extra ...string) *electorProc {
		return startElector(t, id, batonBin, append([]string{
			"-backend", "k8s://" + ns + "?kubeconfig=" + kubeconfig, "-lease", lease, "-id", id, "-ttl", ttl.String(),
		}, extra...)...)
	}
	startClientGo := func(id string) *electorProc {
		return startElector(t, id, clientGoBin, "-kubeconfig", kubeconfig, "-namespace", ns, "-lease", lease, "-id", id,
			"-lease-duration", ttl.String(), "-renew-deadline", "2s", "-retry-period", "500ms")
	}
	const wait = time.Minute

	observer := startBaton("observer", "-observe")
	observer.await(t, wait, "leader", "-", "-")

	// 1. baton-1 leads; client-go-1 sees it and waits while baton-1 renews.
	b1 := startBaton("baton-1")
	t1 := tokenArg(t, b1, b1.await(t, wait, "started"), 0)
	c1 := startClientGo("client-go-1")
	c1.await(t, wait, "leader", "baton-1")
	hist.renewals(t, "baton-1", 3)
	c1.none(t, "started", "while baton-1 renewed the Lease")

	// 2. kill -9 baton-1: client-go-1 takes over after a lease duration.
	b1.kill(t)
	c1.await(t, wait, "started")

	// 3. baton-2 sees client-go-1 lead, with a token above baton-1's, and
	// waits while client-go-1 renews.
	b2 := startBaton("baton-2")
	tc1 := tokenArg(t, b2, b2.await(t, wait, "leader", "client-go-1"), 1)
	if tc1 <= t1 {
		t.Errorf("baton-2 sees client-go-1's term as token %d, not above baton-1's %d", tc1, t1)
	}
	hist.renewals(t, "client-go-1", 3)
	b2.none(t, "started", "while client-go-1 renewed the Lease")

	// 4. kill -9 client-go-1: baton-2 takes over after a lease duration.
	c1.kill(t)
	t2 := tokenArg(t, b2, b2.await(t, wait, "started"), 0)
	if t2 <= tc1 {
		t.Errorf("baton-2's token %d is not above client-go-1's %d", t2, tc1)
	}

	// 5. client-go-2 sees baton-2 and waits; SIGTERM to baton-2 stops its
	// work, releases the Lease, and client-go-2 takes it.
	c2 := startClientGo("client-go-2")
	c2.await(t, wait, "leader", "baton-2")
	hist.renewals(t, "baton-2", 3)
	c2.none(t, "started", "while baton-2 renewed the Lease")
	b2.stop(t, wait)
	c2.await(t, wait, "started")

	// 6. baton-3 sees client-go-2 with a token above baton-2's and waits;
	// SIGTERM to client-go-2 stops its work, releases the Lease, and
	// baton-3 takes it, woken by its watch.
	b3 := startBaton("baton-3")
	tc2 := tokenArg(t, b3, b3.await(t, wait, "leader", "client-go-2"), 1)
	if tc2 <= t2 {
		t.Errorf("baton-3 sees client-go-2's term as token %d, not above baton-2's %d", tc2, t2)
	}
	hist.renewals(t, "client-go-2", 3)
	b3.none(t, "started", "while client-go-2 renewed the Lease")
	c2.stop(t, wait)
	t3 := tokenArg(t, b3, b3.await(t, wait, "started"), 0)
	if t3 <= tc2 {
		t.Errorf("baton-3's token %d is not above client-go-2's %d", t3, tc2)
	}
	b3.stop(t, wait)
	testkit.Eventually(t, wait, "the test's watch to see baton-3 release the Lease", func() bool {
		v, ok := hist.last("baton-3")
		vs := hist.snapshot()
		return ok && vs[len(vs)-1].holder == "" && vs[len(vs)-1].transitions == v.transitions
	})

	// The leading spans, in order, never overlap. A killed holder's span
	// ends when a cut-off one's could have: its last write + its lease
	// duration.
	type span struct {
		who        string
		start, end time.Time
	}
	killedSpan := func(p *electorProc) span {
		start := p.await(t, 0, "started").at
		v, ok := hist.last(p.id)
		if !ok {
			t.Fatalf("the Lease never named %s", p.id)
		}
		return span{p.id, start, v.renew.Add(v.duration)}
	}
	stoppedSpan := func(p *electorProc) span {
		return span{p.id, p.await(t, 0, "started").at, p.await(t, 0, "stopped").at}
	}
	spans := []span{killedSpan(b1), killedSpan(c1), stoppedSpan(b2), stoppedSpan(c2), stoppedSpan(b3)}
	for i := 1; i < len(spans); i++ {
		prev, next := spans[i-1], spans[i]
		if !next.start.After(prev.end) {
			t.Errorf("%s started leading at %s, before %s's span ended at %s", next.who, next.start.Format(time.RFC3339Nano), prev.who, prev.end.Format(time.RFC3339Nano))
		}
		t.Logf("%s led from %s; %s's span had ended %s before", next.who, next.start.Format(time.RFC3339Nano), prev.who, next.start.Sub(prev.end))
	}

	// On the Lease: each new holder that took over from a holder (not from
	// a release) wrote a full lease duration after the last write it
	// replaced, and every change of holder raised leaseTransitions.
	vs := hist.snapshot()
	var holders []string
	for i, v := range vs {
		if v.holder != "" && (len(holders) == 0 || holders[len(holders)-1] != v.holder) {
			holders = append(holders, v.holder)
		}
		if i == 0 || v.holder == vs[i-1].holder {
			continue
		}
		prev := vs[i-1]
		if prev.holder != "" && v.holder != "" && v.renew.Sub(prev.renew) < prev.duration {
			t.Errorf("%s took the Lease over from %s %s after its last write (renewTime %s → %s), within its lease duration %s",
				v.holder, prev.holder, v.renew.Sub(prev.renew), prev.renew.Format(time.RFC3339Nano), v.renew.Format(time.RFC3339Nano), prev.duration)
		}
		if v.holder != "" && v.transitions <= prev.transitions {
			t.Errorf("%s took the Lease with leaseTransitions %d, not above %d", v.holder, v.transitions, prev.transitions)
		}
	}
	want := []string{"baton-1", "client-go-1", "baton-2", "client-go-2", "baton-3"}
	if !slices.Equal(holders, want) {
		t.Errorf("the Lease's holders in turn: %v, want %v", holders, want)
	}

	// The observer, which never campaigned, heard every holder in turn,
	// and then nobody.
	heard := func() (holders []string, last string) {
		observer.mu.Lock()
		defer observer.mu.Unlock()
		for _, ev := range observer.events {
			if ev.kind != "leader" {
				continue
			}
			last = ev.args[0]
			if last != "-" && (len(holders) == 0 || holders[len(holders)-1] != last) {
				holders = append(holders, last)
			}
		}
		return holders, last
	}
	testkit.Eventually(t, wait, "the observer to hear baton-3 release the Lease", func() bool {
		h, last := heard()
		return len(h) >= len(want) && last == "-"
	})
	if h, _ := heard(); !slices.Equal(h, want) {
		t.Errorf("the observer heard the holders %v, want %v", h, want)
	}
	observer.stop(t, wait)
}
