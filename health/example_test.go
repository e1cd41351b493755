package health_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
	"github.com/batonhq/baton/health"
)

// An Elector's leader health check, mounted on the program's own mux: 200
// while it leads, 429 while another candidate does.
func ExampleNewLeader() {
	store := memory.NewStore()
	b, _ := memory.New(store, memory.Options{})
	defer b.Close(context.Background())
	e, _ := baton.NewElector(b, baton.ElectorConfig{Lease: "report", Candidate: baton.Candidate{ID: "web-1"}})

	h, err := health.NewLeader(e, health.Options{})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+health.Path, h)
	probe := func() {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", health.Path, nil))
		fmt.Println(rec.Code, http.StatusText(rec.Code))
	}

	// Another candidate holds the lease: standby.
	other, _ := memory.New(store, memory.Options{})
	defer other.Close(context.Background())
	t, _ := other.Campaign(context.Background(), "report", baton.Candidate{ID: "web-2"})
	probe()

	// It resigns, and this Elector leads.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, func(ctx context.Context, _ baton.Term) error { <-ctx.Done(); return nil })
	}()
	_ = t.Resign(context.Background())
	_, _ = e.Await(context.Background())
	probe()
	cancel()
	<-done
	// Output:
	// 429 Too Many Requests
	// 200 OK
}
