package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// TestLeadersAfterSchemaDropped: a database that lost baton's schema (a
// restore without it, a DROP SCHEMA) answers Leaders as it answers Leader:
// nobody holds the leases, and the schema is made again, so that the next
// campaign wins.
func TestLeadersAfterSchemaDropped(t *testing.T) {
	pool := newPool(t, testserver.SharedPostgres(t).NewDatabase(t))
	b, err := postgres.New(context.Background(), pool, postgres.Options{Config: backend.Config{TTL: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	names := []string{"dropped-a", "dropped-b"}
	term := testkit.CampaignWithin(t, b, names[0], "a", 10*time.Second)
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), "DROP SCHEMA "+postgres.DefaultSchema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	_, errs := b.Leaders(testkit.Context(t, 10*time.Second), names)
	for i, err := range errs {
		if !errors.Is(err, baton.ErrNoLeader) {
			t.Errorf("Leaders of %s after the schema was dropped: %v, want ErrNoLeader", names[i], err)
		}
	}
	testkit.CampaignWithin(t, b, names[1], "b", 10*time.Second)
	recs, errs := b.Leaders(testkit.Context(t, 10*time.Second), names)
	if !errors.Is(errs[0], baton.ErrNoLeader) || errs[1] != nil || recs[1].Holder != "b" {
		t.Errorf("Leaders after a campaign on the new schema: %+v, %v; want nobody, then b", recs, errs)
	}
}
