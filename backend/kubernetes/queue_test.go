package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	k8s "k8s.io/client-go/kubernetes"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/kubernetes"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestQueueObject drives a lease's queue object on the API server
// through Stores of their own, as separate processes would: joins in
// order, a join again goes to the tail, dropping the head only drops a
// process that is the head, leaving empties it; and 10 processes joining
// at once, each from a Store that has not seen the others' updates, all
// land (each update is conditional on the object's resourceVersion and
// retried after a conflict).
func TestQueueObject(t *testing.T) {
	srv := testserver.SharedKubeAPIServer(t)
	store := func() *kubernetes.Store {
		rc := restConfig(srv, srv.Host(), testserver.KubeAdminUser)
		rc.QPS = -1
		cs, err := k8s.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		return kubernetes.NewStore(cs, "default")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease := testkit.Unique("queueobj")
	a, b, c := store(), store(), store()
	head := func(want string) {
		t.Helper()
		got, err := store().QueueHead(ctx, lease, "")
		if err != nil || got != want {
			t.Fatalf("QueueHead = %q, %v; want %q", got, err, want)
		}
	}
	head("")
	for _, step := range []struct {
		s    *kubernetes.Store
		join string
	}{{a, "pa"}, {b, "pb"}, {c, "pc"}} {
		if err := step.s.JoinQueue(ctx, lease, step.join); err != nil {
			t.Fatal(err)
		}
	}
	head("pa")
	if got, err := b.QueueHead(ctx, lease, "pa"); err != nil || got != "pb" {
		t.Fatalf("QueueHead passing over pa = %q, %v; want pb", got, err)
	}
	if err := a.JoinQueue(ctx, lease, "pa"); err != nil { // to the tail
		t.Fatal(err)
	}
	head("pb")
	if err := c.DropQueueHead(ctx, lease, "pc"); err != nil { // not the head: stays
		t.Fatal(err)
	}
	head("pb")
	if err := c.DropQueueHead(ctx, lease, "pb"); err != nil {
		t.Fatal(err)
	}
	head("pc")
	for _, p := range []string{"pc", "pa", "pa"} { // leaving twice is no error
		if err := b.LeaveQueue(ctx, lease, p); err != nil {
			t.Fatal(err)
		}
	}
	head("")

	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := range 10 {
		s := store()
		wg.Go(func() { errs <- s.JoinQueue(ctx, lease, fmt.Sprintf("q%d", i)) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for range 10 {
		h, err := store().QueueHead(ctx, lease, "")
		if err != nil || h == "" || seen[h] {
			t.Fatalf("after 10 joins at once: head %q (err %v), already seen %v: a join was lost", h, err, seen)
		}
		seen[h] = true
		if err := a.DropQueueHead(ctx, lease, h); err != nil {
			t.Fatal(err)
		}
	}
	head("")
}

// A lease name that names another lease's queue object is refused at
// once, with the reason.
func TestQueueNamesAreNotLeaseNames(t *testing.T) {
	err := kubernetes.CheckLeaseName("nightly" + kubernetes.QueueSuffix)
	var ce *baton.ConfigError
	if err == nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), `queue of the processes waiting for lease "nightly"`) {
		t.Fatalf("CheckLeaseName(nightly%s) = %v, want a ConfigError naming the lease it queues for", kubernetes.QueueSuffix, err)
	}
	if err := kubernetes.CheckLeaseName("nightly.baton-queues"); err != nil {
		t.Fatalf("CheckLeaseName(nightly.baton-queues) = %v, want nil", err)
	}
}
