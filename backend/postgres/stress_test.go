package postgres_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/jackc/pgx/v5"
)

// TestFencedWritersAcrossHandOvers is a stress test of the fence: three
// processes hand one lease over and over; while each holds it, four
// writers make fenced transactions that pause a few milliseconds between
// the fence and the write, and go on with the old token for a while after
// the term ended (stale writers, as a holder that was slow to stop would).
// Each write moves a counter row up to its token, only if the counter is
// not already above it, and records a violation in the same transaction
// if it is: a violation that commits is a stale write accepted after a
// later term's. There must be none, while stale writers were refused.
func TestFencedWritersAcrossHandOvers(t *testing.T) {
	const (
		processes = 3
		writers   = 4
		handOvers = 40
	)
	pg := testserver.SharedPostgres(t)
	dbURL := pg.NewDatabase(t)
	check := newPool(t, dbURL)
	newBackend(t, check, time.Second) // the schema
	mustExec(t, check, "CREATE TABLE counter (id int PRIMARY KEY, token bigint NOT NULL)")
	mustExec(t, check, "INSERT INTO counter VALUES (1, 0)")
	mustExec(t, check, "CREATE TABLE writes (token bigint NOT NULL, stale bool NOT NULL)")
	mustExec(t, check, "CREATE TABLE violations (token bigint NOT NULL, counter bigint NOT NULL)")
	lease := testkit.Unique("stress")

	var (
		terms    atomic.Int64
		accepted atomic.Int64
		refused  atomic.Int64 // stale writes the fence refused
		failed   atomic.Int64 // other errors
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for p := range processes {
		pool := newPool(t, dbURL)
		b := newBackend(t, pool, time.Second)
		id := string(rune('a' + p))
		wg.Go(func() {
			for terms.Load() < handOvers && ctx.Err() == nil {
				term, err := b.Campaign(ctx, lease, baton.Candidate{ID: id})
				if err != nil {
					if ctx.Err() == nil {
						t.Logf("%s: campaign: %v", id, err)
					}
					continue
				}
				terms.Add(1)
				var ww sync.WaitGroup
				for range writers {
					ww.Go(func() {
						var endedAt time.Time
						staleFor := time.Duration(rand.IntN(30)) * time.Millisecond
						for {
							select {
							case <-term.Done():
								if endedAt.IsZero() {
									endedAt = time.Now()
								}
							default:
							}
							stale := !endedAt.IsZero()
							if stale && time.Since(endedAt) > staleFor {
								return
							}
							err := postgres.Fenced(ctx, pool, "", term, func(tx pgx.Tx) error {
								time.Sleep(time.Duration(rand.IntN(5000)) * time.Microsecond) // a pause between fence and write
								var cur int64
								if err := tx.QueryRow(ctx, "SELECT token FROM counter WHERE id = 1 FOR UPDATE").Scan(&cur); err != nil {
									return err
								}
								if cur > int64(term.Token()) {
									_, err := tx.Exec(ctx, "INSERT INTO violations VALUES ($1, $2)", int64(term.Token()), cur)
									return err
								}
								if _, err := tx.Exec(ctx, "UPDATE counter SET token = $1 WHERE id = 1", int64(term.Token())); err != nil {
									return err
								}
								_, err := tx.Exec(ctx, "INSERT INTO writes VALUES ($1, $2)", int64(term.Token()), stale)
								return err
							})
							switch {
							case err == nil:
								accepted.Add(1)
							case errors.Is(err, postgres.ErrFenced):
								refused.Add(1)
							default:
								if ctx.Err() == nil {
									failed.Add(1)
								}
							}
						}
					})
				}
				time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond) // hold the lease a while
				rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := term.Resign(rctx); err != nil {
					t.Logf("%s: resign: %v", id, err)
				}
				rcancel()
				ww.Wait()
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("only %d terms before the deadline", terms.Load())
	}
	v := count(t, check, "SELECT count(*) FROM violations")
	tokens := count(t, check, "SELECT count(DISTINCT token) FROM writes")
	t.Logf("%d terms, %d tokens with writes, %d fenced writes accepted, %d stale ones refused, %d other errors, %d stale writes accepted",
		terms.Load(), tokens, accepted.Load(), refused.Load(), failed.Load(), v)
	if v != 0 {
		t.Errorf("%d stale writes committed after a later term's write", v)
	}
	if refused.Load() == 0 {
		t.Errorf("no stale write was refused: the test did not attack")
	}
	if tokens < handOvers/2 {
		t.Errorf("writes under only %d tokens over %d terms", tokens, terms.Load())
	}
}
