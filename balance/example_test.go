package balance_test

import (
	"context"
	"fmt"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/balance"
)

// Two instances run the same four leases. The first alone leads all four;
// when the second joins, the first sheds two of them to it.
func Example() {
	store := memory.NewStore() // in production: etcd.New(client, ...) and so on
	timing := memory.Options{Config: backend.Config{TTL: time.Second}}
	start := func(id string) (*balance.Group, func()) {
		b, _ := memory.New(store, timing)
		g, _ := balance.New(b, balance.Config{
			Group:           "reports",
			Candidate:       baton.Candidate{ID: id},
			RefreshInterval: 50 * time.Millisecond, // fast, for the example
			ShedAfter:       200 * time.Millisecond,
		})
		for _, name := range []string{"report-eu", "report-us", "report-ap", "report-sa"} {
			_ = g.Add(name, func(ctx context.Context, t baton.Term) error {
				// Leader-only work goes here. Send t.Token() with every
				// write, and stop when ctx is cancelled.
				<-ctx.Done()
				return nil
			})
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = g.Run(ctx); close(done) }()
		return g, func() { cancel(); <-done; _ = b.Close(context.Background()) }
	}
	leads := func(g *balance.Group, n int) {
		for len(g.Status().Leading) != n {
			time.Sleep(10 * time.Millisecond)
		}
	}

	web1, stop1 := start("web-1")
	defer stop1()
	leads(web1, 4)
	fmt.Println("web-1 alone leads", web1.Status().Leading)

	web2, stop2 := start("web-2")
	defer stop2()
	leads(web1, 2)
	leads(web2, 2)
	s := web2.Status()
	fmt.Printf("with %d members, share %d: web-1 leads %d, web-2 leads %d\n",
		s.Members, s.Share, len(web1.Status().Leading), len(s.Leading))
	// Output:
	// web-1 alone leads [report-ap report-eu report-sa report-us]
	// with 2 members, share 2: web-1 leads 2, web-2 leads 2
}
