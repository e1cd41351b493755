package kubernetes_test

import (
	"context"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// skewedHolder is a holder outside baton whose wall clock is off by skew:
// it writes the Lease in client-go's layout, with renewTime from its own
// clock, every interval until stopped.
type skewedHolder struct {
	leases interface {
		Get(context.Context, string, metav1.GetOptions) (*coordinationv1.Lease, error)
		Update(context.Context, *coordinationv1.Lease, metav1.UpdateOptions) (*coordinationv1.Lease, error)
	}
	name string
	skew time.Duration

	mu        sync.Mutex
	renewals  int
	lastWrite time.Time // when the last confirmed write returned
}

func (h *skewedHolder) renew(ctx context.Context) error {
	l, err := h.leases.Get(ctx, h.name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.NewMicroTime(time.Now().Add(h.skew))
	l.Spec.RenewTime = &now
	if _, err := h.leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		return err
	}
	h.mu.Lock()
	h.renewals++
	h.lastWrite = time.Now()
	h.mu.Unlock()
	return nil
}

func (h *skewedHolder) state() (int, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renewals, h.lastWrite
}

// TestTakeoverIgnoresRenewTime attacks the takeover rule with holders whose
// clocks are an hour off. A live holder whose renewTime reads an hour old
// keeps the Lease for as long as it renews (a contender comparing renewTime
// with its own clock would take it at once), and a dead holder whose
// renewTime reads an hour ahead is replaced a lease duration after its last
// write (such a contender would wait an hour). Either way baton times the
// holder by the resourceVersion it sees change, on its own monotonic clock.
func TestTakeoverIgnoresRenewTime(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	ns := grantLeases(t, srv, "baton-takeover")
	cs, err := k8s.NewForConfig(restConfig(srv, srv.Host(), testserver.KubeUser))
	if err != nil {
		t.Fatal(err)
	}
	const duration = 2 // leaseDurationSeconds of the outside holder
	for _, tc := range []struct {
		name string
		skew time.Duration
	}{
		{"clock-behind", -time.Hour},
		{"clock-ahead", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testkit.Context(t, 2*time.Minute)
			leases := cs.CoordinationV1().Leases(ns)
			holder, secs, transitions := "outside", int32(duration), int32(5)
			at := metav1.NewMicroTime(time.Now().Add(tc.skew))
			if _, err := leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
					AcquireTime: &at, RenewTime: &at, LeaseTransitions: &transitions},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			h := &skewedHolder{leases: leases, name: tc.name, skew: tc.skew}
			stop := make(chan struct{})
			stopped := make(chan struct{})
			halt := sync.OnceFunc(func() { close(stop); <-stopped })
			t.Cleanup(halt) // a test that failed early still stops the holder
			go func() {
				defer close(stopped)
				tick := time.NewTicker(250 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if err := h.renew(ctx); err != nil {
							if ctx.Err() == nil {
								t.Errorf("outside holder's renewal: %v", err)
							}
							return
						}
					}
				}
			}()

			b, err := kubernetes.New(cs, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: time.Second}}, Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			testkit.CloseAtEnd(t, b, 5*time.Second)
			won := testkit.CampaignAsync(t, b, tc.name, "baton")
			// Three lease durations of renewals, with baton campaigning.
			testkit.Eventually(t, time.Minute, "the outside holder to renew 24 times", func() bool {
				n, _ := h.state()
				return n >= 24
			})
			select {
			case w := <-won:
				t.Fatalf("baton took the Lease (token %d) from a holder that kept renewing", w.Term.Token())
			default:
			}
			halt()
			_, last := h.state()
			w := testkit.WaitTerm(t, won, time.Minute)
			gap := w.At.Sub(last)
			t.Logf("baton took over %s after the outside holder's last write", gap)
			if gap < duration*time.Second {
				t.Errorf("baton took over %s after the holder's last write; want at least its lease duration, %d s", gap, duration)
			}
			if w.Term.Token() <= uint64(transitions) {
				t.Errorf("baton's token %d is not above the outside holder's %d", w.Term.Token(), transitions)
			}
			resignTerm(t, w.Term)
		})
	}
}
