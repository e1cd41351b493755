// Package turns is the candidate process of a chaos run with several
// candidates per process (`baton-chaos --turns N`): one Backend, opened
// from a `--backend` URL as `baton run` takes it, and N Electors on it for
// one lease, which take turns in the process (the backend's line of
// candidates per lease, backend/slots.go and the record stores'). Each
// term's work writes to the harness's fenced store with the term's token,
// as a `baton run` child does, until the term ends (its context ends at
// safe-until, or the term was lost) or its length, drawn at random up to
// --term-max, has passed: then it returns, the Elector releases the lease,
// and the next candidate in line (of another process, or this one's next)
// takes it. So a run exercises the process's line, the store's queue of
// waiting processes, and graceful hand-overs between them, under faults.
//
// There is no guard process: the work runs in the candidate's process, so
// stopping that process (stop-tree) stops the work with it, the paused
// case, which the harness only injects as stop-tree here.
package turns

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/backend/postgres"
	"github.com/batonhq/baton/backend/redis"
	"github.com/batonhq/baton/chaos/internal/store"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schemes are the --backend URL schemes Main opens.
var Schemes = []string{"consul", "redis", "postgres"}

// Main runs `turns --backend URL --lease NAME --ids A,B,... --ttl D
// --store SOCKET --every D --term-max D` until SIGTERM or SIGINT, and
// returns the process's exit code: 0 when stopped by a signal (every
// Elector resigned), 1 when the backend could not be opened or an Elector
// failed, 2 for bad arguments.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("turns", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("backend", "", "the backend's URL: consul://, redis:// or postgres://")
	lease := fs.String("lease", "chaos", "the lease")
	ids := fs.String("ids", "", "comma-separated candidate ids, one Elector each")
	ttl := fs.Duration("ttl", 3*time.Second, "the lease's TTL")
	sock := fs.String("store", "", "the fenced store's Unix socket")
	every := fs.Duration("every", 20*time.Millisecond, "time between writes")
	termMax := fs.Duration("term-max", 0, "a term's work returns after a random time up to this (0: never)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch {
	case *url == "" || *ids == "" || *sock == "":
		fmt.Fprintln(stderr, "turns: --backend, --ids and --store are required")
		return 2
	case *ttl <= 0 || *every <= 0 || *termMax < 0:
		fmt.Fprintln(stderr, "turns: --ttl and --every must be positive, --term-max not negative")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	b, closeB, err := open(ctx, *url, *ttl, log)
	if err != nil {
		if ctx.Err() != nil {
			return 0
		}
		fmt.Fprintf(stderr, "turns: %v\n", err)
		return 1
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = closeB(cctx)
	}()
	var wg sync.WaitGroup
	errs := make(chan error, len(strings.Split(*ids, ",")))
	for _, id := range strings.Split(*ids, ",") {
		e, err := baton.NewElector(b, baton.ElectorConfig{Lease: *lease, Candidate: baton.Candidate{ID: id},
			Logger: log.With("baton.id", id), RetryMax: *ttl})
		if err != nil {
			fmt.Fprintf(stderr, "turns: %v\n", err)
			return 2
		}
		wg.Go(func() {
			err := e.Run(ctx, func(ctx context.Context, t baton.Term) error {
				log.Info("elected", "baton.id", id, "baton.token", t.Token())
				wctx := ctx
				if *termMax > 0 {
					var cancel context.CancelFunc
					wctx, cancel = context.WithTimeout(ctx, time.Duration(rand.Int64N(int64(*termMax)))+*every)
					defer cancel()
				}
				c := store.Child{Socket: *sock, Candidate: id, Token: t.Token(), Every: *every}
				if err := c.Run(wctx); err != nil && wctx.Err() == nil {
					return fmt.Errorf("write to the store: %w", err)
				}
				log.Info("work returned", "baton.id", id, "baton.token", t.Token(), "cause", context.Cause(wctx))
				return nil
			})
			if ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", id, err)
				stop()
			}
		})
	}
	wg.Wait()
	close(errs)
	code := 0
	for err := range errs {
		fmt.Fprintf(stderr, "turns: %v\n", err)
		code = 1
	}
	return code
}

// open opens the backend of url with TTL ttl, retrying while it cannot be
// reached (the harness may have cut it off or stopped it), and returns it
// with the function that closes it.
func open(ctx context.Context, url string, ttl time.Duration, log *slog.Logger) (baton.Backend, func(context.Context) error, error) {
	scheme, _, _ := strings.Cut(url, "://")
	cfg := backend.Config{TTL: ttl}
	switch scheme {
	case "consul":
		cc, opts, err := consul.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		client, err := consul.NewClient(cc)
		if err != nil {
			return nil, nil, err
		}
		opts.Config, opts.Logger = cfg, log
		b, err := consul.New(client, opts)
		if err != nil {
			return nil, nil, err
		}
		return b, b.Close, nil
	case "redis":
		uc, err := redis.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		client := uc.NewClient()
		opts := uc.Options
		opts.Config, opts.Logger = cfg, log
		b, err := retry(ctx, func() (*redis.Backend, error) { return redis.New(ctx, client, opts) })
		if err != nil {
			_ = client.Close()
			return nil, nil, err
		}
		return b, func(ctx context.Context) error { defer client.Close(); return b.Close(ctx) }, nil
	case "postgres":
		uc, err := postgres.ParseURL(url)
		if err != nil {
			return nil, nil, err
		}
		pool, err := pgxpool.NewWithConfig(ctx, uc.Pool)
		if err != nil {
			return nil, nil, err
		}
		opts := uc.Options
		opts.Config, opts.Logger = cfg, log
		b, err := retry(ctx, func() (*postgres.Backend, error) { return postgres.New(ctx, pool, opts) })
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return b, func(ctx context.Context) error { defer pool.Close(); return b.Close(ctx) }, nil
	}
	return nil, nil, fmt.Errorf("--backend %q: the scheme must be one of %s", url, strings.Join(Schemes, ", "))
}

// retry calls f until it succeeds, fails with a *baton.ConfigError (which
// retrying does not fix), or ctx ends, pausing a second between attempts.
func retry[B any](ctx context.Context, f func() (B, error)) (B, error) {
	for {
		b, err := f()
		var ce *baton.ConfigError
		if err == nil || errors.As(err, &ce) {
			return b, err
		}
		select {
		case <-ctx.Done():
			return b, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
