package memory_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/memory"
)

// Each Backend is one process's connection to the shared Store. A holder
// that resigns hands over at once; Leader reports who holds the lease.
func Example() {
	ctx := context.Background()
	store := memory.NewStore()
	a, _ := memory.New(store, memory.Options{})
	b, _ := memory.New(store, memory.Options{})
	defer a.Close(ctx)
	defer b.Close(ctx)

	ta, _ := a.Campaign(ctx, "reports", baton.Candidate{ID: "a"})
	rec, _ := b.Leader(ctx, "reports")
	fmt.Println("holder:", rec.Holder, "token:", rec.Token)

	_ = ta.Resign(ctx)
	fmt.Println("a's term ended:", errors.Is(ta.Err(), baton.ErrResigned))

	tb, _ := b.Campaign(ctx, "reports", baton.Candidate{ID: "b"})
	rec, _ = a.Leader(ctx, "reports")
	fmt.Println("holder:", rec.Holder, "token:", tb.Token())
	// Output:
	// holder: a token: 1
	// a's term ended: true
	// holder: b token: 2
}
