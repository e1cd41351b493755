// Command batonelector runs a baton Elector on a Kubernetes Lease
// (backend/kubernetes): the baton side of the interop tests of package
// kubernetes, as a process of its own, to kill or stop.
//
// It prints one line per event on standard output, each starting with the
// wall-clock time in Unix nanoseconds and its candidate ID:
//
//	UNIXNANO started ID TOKEN   a term began; its work runs from here
//	UNIXNANO stopped ID TOKEN   the term's work has stopped (the lease is released after this)
//	UNIXNANO leader ID HOLDER TOKEN   Elector.WatchLeader: HOLDER holds the Lease ("-" "-": nobody)
//
// With -observe it only watches (no campaign). On SIGTERM or SIGINT it
// stops the work, releases the Lease and exits 0; 2 on bad flags or
// configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/kubernetes"
)

func main() { os.Exit(run()) }

func run() int {
	fs := flag.NewFlagSet("batonelector", flag.ContinueOnError)
	rawURL := fs.String("backend", "", "k8s://NAMESPACE?kubeconfig=PATH (required)")
	lease := fs.String("lease", "", "lease name (required)")
	id := fs.String("id", "", "candidate ID (required)")
	ttl := fs.Duration("ttl", 10*time.Second, "lease TTL")
	observe := fs.Bool("observe", false, "only watch who leads")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if *rawURL == "" || *lease == "" || *id == "" {
		fmt.Fprintln(os.Stderr, "batonelector: -backend, -lease and -id are required")
		return 2
	}
	u, err := kubernetes.ParseURL(*rawURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "batonelector:", err)
		return 2
	}
	b, err := kubernetes.Open(u, kubernetes.Options{RecordOptions: backend.RecordOptions{Config: backend.Config{TTL: *ttl}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "batonelector:", err)
		return 2
	}
	e, err := baton.NewElector(b, baton.ElectorConfig{Lease: *lease, Candidate: baton.Candidate{ID: *id}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "batonelector:", err)
		return 2
	}

	var outMu sync.Mutex
	say := func(event string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		f := []string{fmt.Sprint(time.Now().UnixNano()), event, *id}
		for _, a := range args {
			f = append(f, fmt.Sprint(a))
		}
		fmt.Fprintln(os.Stdout, strings.Join(f, " "))
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = e.WatchLeader(ctx, func(rec baton.Record, err error) {
			switch {
			case errors.Is(err, baton.ErrNoLeader):
				say("leader", "-", "-")
			case err != nil:
				fmt.Fprintln(os.Stderr, "batonelector: watch:", err)
			default:
				say("leader", rec.Holder, rec.Token)
			}
		})
	})
	code := 0
	if *observe {
		<-ctx.Done()
	} else {
		err = e.Run(ctx, func(ctx context.Context, t baton.Term) error {
			say("started", t.Token())
			<-ctx.Done()
			say("stopped", t.Token())
			return nil
		})
		if err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "batonelector:", err)
			code = 2
		}
	}
	stop()
	wg.Wait()
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Close(cctx); err != nil {
		fmt.Fprintln(os.Stderr, "batonelector: close:", err)
	}
	return code
}
