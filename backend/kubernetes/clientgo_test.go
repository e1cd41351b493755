package kubernetes_test

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// clientGoElector is client-go's LeaderElector on Lease name in ns, as
// identity id, with the given lease duration. Its leading spans are
// reported on started (when OnStartedLeading ran) and, if stopped is not
// nil, on stopped (when the context client-go gave OnStartedLeading
// ended: when client-go tells its program to stop). Its Run ends when its
// context does, releasing the Lease if release (ReleaseOnCancel), or when
// it lost the Lease.
func clientGoElector(t *testing.T, cs k8s.Interface, ns, name, id string, lease time.Duration, release bool, started, stopped chan<- time.Time) *leaderelection.LeaderElector {
	t.Helper()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: name, Namespace: ns},
			Client:     cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		},
		LeaseDuration:   lease,
		RenewDeadline:   lease * 2 / 3,
		RetryPeriod:     lease / 6,
		ReleaseOnCancel: release,
		Name:            name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				started <- time.Now()
				if stopped != nil {
					<-ctx.Done()
					stopped <- time.Now()
				}
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return le
}

// TestClientGoElectorSharesLease runs baton and client-go's LeaderElector
// on one Lease: baton → client-go → baton, by graceful release each time.
// Neither leads while the other does, each side's view names the other,
// and the fencing tokens rise across all three terms, the client-go term's
// token being the one baton reads from the Lease.
func TestClientGoElectorSharesLease(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	const lease = "shared"
	ns := grantLeases(t, srv, "baton-clientgo")
	rc := restConfig(srv, srv.Host(), testserver.KubeUser)
	cs, err := k8s.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := backend.Config{TTL: 2 * time.Second}
	newBaton := func() *kubernetes.Backend {
		b, err := kubernetes.New(cs, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: cfg}, Namespace: ns})
		if err != nil {
			t.Fatal(err)
		}
		return testkit.CloseAtEnd(t, b, 5*time.Second)
	}
	a, c := newBaton(), newBaton()

	// 1. baton leads; client-go campaigns and must wait.
	ta := testkit.CampaignWithin(t, a, lease, "baton-a", 10*time.Second)
	started := make(chan time.Time, 1)
	cgCtx, cgCancel := context.WithCancel(context.Background())
	defer cgCancel()
	le := clientGoElector(t, cs, ns, lease, "client-go", 2*time.Second, true, started, nil)
	var wg sync.WaitGroup
	wg.Go(func() { le.Run(cgCtx) })
	defer wg.Wait()
	// client-go reads the Lease and sees baton's holder. Let baton renew
	// twice while client-go watches, so that client-go waiting is not luck.
	testkit.Eventually(t, 10*time.Second, "client-go to see baton-a lead", func() bool { return le.GetLeader() == "baton-a" })
	for range 2 {
		su := ta.SafeUntil()
		testkit.Eventually(t, 10*time.Second, "baton-a to renew", func() bool { return ta.SafeUntil().After(su) })
	}
	select {
	case at := <-started:
		t.Fatalf("client-go started leading at %v while baton-a held the Lease (token %d)", at, ta.Token())
	default:
	}

	// 2. baton resigns; client-go takes the Lease.
	resignedAt := time.Now()
	resignTerm(t, ta)
	var cgStart time.Time
	select {
	case cgStart = <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("client-go did not take the Lease baton-a released")
	}
	if cgStart.Before(resignedAt) {
		t.Fatalf("client-go started leading at %v, before baton-a resigned at %v", cgStart, resignedAt)
	}
	rec, err := a.Leader(context.Background(), lease)
	if err != nil || rec.Holder != "client-go" {
		t.Fatalf("baton's Leader while client-go leads = %+v, %v; want holder client-go", rec, err)
	}
	if rec.Token <= ta.Token() {
		t.Errorf("client-go's term reads as token %d, not above baton-a's %d", rec.Token, ta.Token())
	}
	cgToken := rec.Token

	// 3. baton campaigns while client-go leads, and must wait; client-go
	// stops (releasing the Lease) and baton takes it at once, by the watch.
	won := testkit.CampaignAsync(t, c, lease, "baton-c")
	testkit.Eventually(t, 10*time.Second, "client-go to renew", func() bool {
		r, err := c.Leader(context.Background(), lease)
		return err == nil && r.Holder == "client-go"
	})
	select {
	case w := <-won:
		t.Fatalf("baton-c won token %d while client-go led", w.Term.Token())
	default:
	}
	stoppedAt := time.Now()
	cgCancel()
	w := testkit.WaitTerm(t, won, 30*time.Second)
	if w.At.Before(stoppedAt) {
		t.Fatalf("baton-c acquired at %v, before client-go stopped at %v", w.At, stoppedAt)
	}
	if w.Term.Token() <= cgToken {
		t.Errorf("baton-c's token %d is not above client-go's %d", w.Term.Token(), cgToken)
	}
	wg.Wait()
	if got := le.GetLeader(); got != "" && got != "client-go" {
		t.Logf("client-go's last view of the leader: %q", got)
	}
	resignTerm(t, w.Term)
}

// TestClientGoElectorCutOff cuts a leading client-go elector off from the
// API server, as a crash or a partition would, with a baton candidate
// waiting: baton takes the Lease only after client-go told its program to
// stop (RenewDeadline after its last renewal, which is shorter than the
// lease duration baton waits from the last change it saw), with a token
// above the client-go term's.
func TestClientGoElectorCutOff(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	const lease = "shared"
	ns := grantLeases(t, srv, "baton-clientgo-cut")
	proxy := testserver.StartProxy(t, srv.Addr())
	cgConfig := restConfig(srv, "https://"+proxy.Addr(), testserver.KubeUser)
	cgConfig.Timeout = 5 * time.Second // client-go's requests through the cut fail rather than hang
	cgClient, err := k8s.NewForConfig(cgConfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeUser))
	if err != nil {
		t.Fatal(err)
	}
	started, stopped := make(chan time.Time, 1), make(chan time.Time, 1)
	le := clientGoElector(t, cgClient, ns, lease, "client-go", 3*time.Second, false, started, stopped)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { le.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("client-go did not take the free Lease")
	}

	b, err := kubernetes.New(cs, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: 2 * time.Second}}, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CloseAtEnd(t, b, 5*time.Second)
	won := testkit.CampaignAsync(t, b, lease, "baton")
	// client-go renews (and baton sees the Lease change) a few times first.
	leases := cs.CoordinationV1().Leases(ns)
	seen := map[string]bool{}
	var cgToken uint64
	testkit.Eventually(t, 30*time.Second, "client-go to renew three times", func() bool {
		l, err := leases.Get(context.Background(), lease, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "client-go" {
			seen[l.ResourceVersion] = true
			if l.Spec.LeaseTransitions != nil {
				cgToken = uint64(*l.Spec.LeaseTransitions)
			}
		}
		return len(seen) >= 3
	})
	select {
	case w := <-won:
		t.Fatalf("baton won token %d while client-go renewed", w.Term.Token())
	default:
	}
	proxy.Cut()
	w := testkit.WaitTerm(t, won, time.Minute)
	var stoppedAt time.Time
	select {
	case stoppedAt = <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("client-go never told its program to stop after it was cut off")
	}
	if !stoppedAt.Before(w.At) {
		t.Errorf("baton acquired at %v, before the cut-off client-go elector stopped leading at %v", w.At, stoppedAt)
	}
	t.Logf("client-go stopped leading %s before baton acquired", w.At.Sub(stoppedAt))
	if w.Term.Token() <= cgToken {
		t.Errorf("baton's token %d is not above client-go's %d", w.Term.Token(), cgToken)
	}
	resignTerm(t, w.Term)
}

// TestTokensRiseWhenClientGoRecreatesLease: the Lease is deleted after a
// baton term and client-go's elector creates it anew, with no token epoch
// and its transitions counting from zero. The next baton term still gets a
// token above the first one's: a Lease without an epoch gets one when baton
// acquires it, and leaseTransitions goes on rising from client-go's count.
func TestTokensRiseWhenClientGoRecreatesLease(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	const lease = "recreated"
	ns := grantLeases(t, srv, "baton-recreated")
	cs, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeUser))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeAdminUser))
	if err != nil {
		t.Fatal(err)
	}
	b, err := kubernetes.New(cs, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: 2 * time.Second}}, Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	testkit.CloseAtEnd(t, b, 5*time.Second)

	first := testkit.CampaignWithin(t, b, lease, "baton-1", 10*time.Second)
	resignTerm(t, first)
	if err := admin.CoordinationV1().Leases(ns).Delete(context.Background(), lease, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// client-go creates the Lease anew, leads, and releases it.
	started := make(chan time.Time, 1)
	cgCtx, cgCancel := context.WithCancel(context.Background())
	defer cgCancel()
	le := clientGoElector(t, cs, ns, lease, "client-go", 2*time.Second, true, started, nil)
	var wg sync.WaitGroup
	wg.Go(func() { le.Run(cgCtx) })
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("client-go did not take the deleted Lease")
	}
	l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Annotations[kubernetes.AnnotationEpoch]; ok {
		t.Fatalf("client-go's new Lease has an epoch annotation: the test no longer shows what it means to: %v", l.Annotations)
	}
	cgCancel()
	wg.Wait()

	second := testkit.CampaignWithin(t, b, lease, "baton-2", 10*time.Second)
	if second.Token() <= first.Token() {
		t.Errorf("baton's token after client-go re-created the Lease is %d, not above the first term's %d", second.Token(), first.Token())
	}
	l, err = cs.CoordinationV1().Leases(ns).Get(context.Background(), lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.LeaseTransitions == nil || uint64(*l.Spec.LeaseTransitions) != second.Token()&0xffffffff {
		t.Errorf("leaseTransitions %v, want the token's counter %d", l.Spec.LeaseTransitions, second.Token()&0xffffffff)
	}
	resignTerm(t, second)
}
