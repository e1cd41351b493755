// Command clientgoelector runs client-go's leaderelection.LeaderElector on
// one Lease, as a Kubernetes controller would: the program the interop
// tests of package kubernetes run beside baton candidates, as a process of
// its own, to kill or stop.
//
// It prints one line per event on standard output, each starting with the
// wall-clock time in Unix nanoseconds and its identity:
//
//	UNIXNANO started ID    OnStartedLeading: it leads from here
//	UNIXNANO stopped ID    its leading work has stopped (SIGTERM, or the Lease lost)
//	UNIXNANO leader ID HOLDER   OnNewLeader: it saw HOLDER take the Lease
//
// On SIGTERM or SIGINT it stops its leading work first and only then
// cancels the elector, which with ReleaseOnCancel gives the Lease up: the
// order ReleaseOnCancel's documentation asks of its callers. It exits 0
// after a signal, 1 when it lost the Lease, 2 on bad flags.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("clientgoelector", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (required)")
	ns := fs.String("namespace", "default", "namespace of the Lease")
	lease := fs.String("lease", "", "name of the Lease (required)")
	id := fs.String("id", "", "this elector's identity (required)")
	leaseDuration := fs.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := fs.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := fs.Duration("retry-period", 2*time.Second, "RetryPeriod")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *kubeconfig == "" || *lease == "" || *id == "" {
		fmt.Fprintln(os.Stderr, "clientgoelector: -kubeconfig, -lease and -id are required")
		return 2
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientgoelector:", err)
		return 2
	}
	cs, err := k8s.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientgoelector:", err)
		return 2
	}

	var outMu sync.Mutex
	say := func(event string, args ...string) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintln(os.Stdout, strings.Join(append([]string{fmt.Sprint(time.Now().UnixNano()), event, *id}, args...), " "))
	}

	sig, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	leCtx, leCancel := context.WithCancel(context.Background())
	defer leCancel()

	// mu orders the start of the leading work against a signal: once
	// stopping is set no work starts, and a signal waits for work that
	// started to stop before the elector is cancelled (and releases).
	var (
		mu       sync.Mutex
		stopping bool
		leading  bool
	)
	workDone := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Name: *lease, Namespace: *ns},
			Client:     cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: *id},
		},
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: true,
		Name:            *lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				mu.Lock()
				if stopping {
					mu.Unlock()
					return
				}
				leading = true
				say("started")
				mu.Unlock()
				select {
				case <-ctx.Done(): // lost the Lease
				case <-sig.Done():
				}
				say("stopped")
				close(workDone)
			},
			OnStoppedLeading: func() {},
			OnNewLeader:      func(holder string) { say("leader", holder) },
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "clientgoelector:", err)
		return 2
	}
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		le.Run(leCtx)
	}()
	select {
	case <-sig.Done():
	case <-runDone:
		// Run returns by itself only when the Lease was lost.
		mu.Lock()
		stopping = true
		l := leading
		mu.Unlock()
		if l {
			<-workDone
		}
		return 1
	}
	mu.Lock()
	stopping = true
	l := leading
	mu.Unlock()
	if l {
		<-workDone
	}
	leCancel()
	<-runDone
	return 0
}
