package backend

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// Requests due within the horizon of the first go in one read, each gets
// its own record (the zero value for a name without one), a withdrawn
// request is left out, and after Off a request is refused.
func TestBatchReader(t *testing.T) {
	var (
		mu    sync.Mutex
		calls [][]string
	)
	br := NewBatchReader(time.Hour, func(_ context.Context, names []string) (map[string]int, error) {
		mu.Lock()
		calls = append(calls, slices.Sorted(slices.Values(names)))
		mu.Unlock()
		return map[string]int{"a": 1, "b": 2}, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); br.Run(ctx) }()

	now := time.Now()
	gone, withdraw := br.Request("gone", now.Add(time.Minute))
	withdraw()
	b, _ := br.Request("b", now.Add(time.Minute)) // within the hour of a's due time
	none, _ := br.Request("none", now.Add(time.Minute))
	a, _ := br.Request("a", now)
	for _, c := range []struct {
		req  *BatchRequest[int]
		want int
	}{{a, 1}, {b, 2}, {none, 0}} {
		select {
		case res := <-c.req.Result():
			if res.Err != nil || res.Value != c.want || res.At.Before(res.Sent) {
				t.Errorf("%s: %+v, want %d", c.req.name, res, c.want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no result", c.req.name)
		}
	}
	select {
	case res := <-gone.Result():
		t.Errorf("a withdrawn request was answered: %+v", res)
	default:
	}
	mu.Lock()
	if len(calls) != 1 || !slices.Equal(calls[0], []string{"a", "b", "none"}) {
		t.Errorf("reads %v, want one of [a b none]", calls)
	}
	mu.Unlock()
	br.Off()
	if req, _ := br.Request("a", now); req != nil {
		t.Error("a request after Off was taken")
	}
	cancel()
	<-done
}
