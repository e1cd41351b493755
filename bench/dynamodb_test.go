package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	batondynamodb "github.com/batonhq/baton/backend/dynamodb"
	"github.com/batonhq/baton/internal/benchci"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

func init() { targets = append(targets, namedTarget{"dynamodb", dynamoTarget}) }

// On-demand prices assumed for the cost figures: us-east-1, as AWS
// published them with the price cut of 1 November 2024 (dollars per
// request unit). docs/backends/dynamodb.md says where to check them.
const (
	dollarsPerWRU = 0.625 / 1e6
	dollarsPerRRU = 0.125 / 1e6
)

// dynamoCounts counts a client's requests, and their request units by
// kind: reads (an item a GetItem, a key a BatchGetItem) and writes
// (PutItem, UpdateItem), as the emulator receives them. Items are all
// under 1 KB, so each is one request unit.
type dynamoCounts struct{ requests, reads, writes atomic.Int64 }

type countingTransport struct {
	next http.RoundTripper
	c    *dynamoCounts
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.c.requests.Add(1)
	switch op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810."); op {
	case "GetItem":
		t.c.reads.Add(1)
	case "BatchGetItem":
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var in struct {
			RequestItems map[string]struct{ Keys []json.RawMessage }
		}
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, fmt.Errorf("BatchGetItem body: %w", err)
		}
		for _, t2 := range in.RequestItems {
			t.c.reads.Add(int64(len(t2.Keys)))
		}
	case "PutItem", "UpdateItem":
		t.c.writes.Add(1)
	}
	return t.next.RoundTrip(r)
}

// dynamoClient returns a client of endpoint with made-up credentials,
// counting its requests in c.
func dynamoClient(endpoint string, c *dynamoCounts) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDBATONBENCH", SecretAccessKey: "secret"}, nil
		}),
		HTTPClient: &http.Client{Transport: countingTransport{next: &http.Transport{}, c: c}},
	})
}

// dynamoTable starts dynalite with baton's table in it.
func dynamoTable(b *testing.B) *testserver.DynaliteProc {
	d := testserver.StartDynalite(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := batondynamodb.CreateTable(ctx, dynamoClient(d.Endpoint, new(dynamoCounts)), "baton-bench"); err != nil {
		b.Fatal(err)
	}
	return d
}

// dynamoTarget runs against one dynalite; every simulated process has its
// own client behind its own proxy, so that killing a process cuts it off
// for good without marking its session dead.
func dynamoTarget(b *testing.B) target {
	d := dynamoTable(b)
	var c dynamoCounts
	return target{
		name: "dynamodb",
		new: func(b *testing.B, cfg backend.Config) *process {
			proxy := testserver.StartProxy(b, d.Addr)
			be, err := batondynamodb.New(context.Background(), dynamoClient("http://"+proxy.Addr(), &c), batondynamodb.Options{Config: cfg, Table: "baton-bench"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = be.Close(ctx)
			})
			return &process{backend: be, kill: proxy.Cut}
		},
		requests: c.requests.Load,
	}
}

// BenchmarkDynamoDBCost measures what a holder of 10 leases, a waiter
// for one of them and a standby waiting for all 10 cost (the standby also
// in requests: it reads its leases with BatchGetItem, and the holder's
// session item once a poll for all of them), in request units per hour and on-demand dollars
// per hour, at a TTL of 3 s (RenewInterval = PollInterval = 1 s), over the
// benchmark's time; the figures scale with 1/interval (10 s TTL: a third).
func BenchmarkDynamoDBCost(b *testing.B) {
	d := dynamoTable(b)
	cfg := backend.Config{TTL: 3 * time.Second}
	var hc, wc dynamoCounts
	holder, err := batondynamodb.New(context.Background(), dynamoClient(d.Endpoint, &hc), batondynamodb.Options{Config: cfg, Table: "baton-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer holder.Close(context.Background())
	for i := range 10 {
		t, err := holder.Campaign(context.Background(), "cost-"+string(rune('a'+i)), baton.Candidate{ID: "h"})
		if err != nil {
			b.Fatal(err)
		}
		defer t.Resign(context.Background())
	}
	waiter, err := batondynamodb.New(context.Background(), dynamoClient(d.Endpoint, &wc), batondynamodb.Options{Config: cfg, Table: "baton-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer waiter.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = waiter.Campaign(ctx, "cost-a", baton.Candidate{ID: "w"}) }()
	var sc dynamoCounts
	standby, err := batondynamodb.New(context.Background(), dynamoClient(d.Endpoint, &sc), batondynamodb.Options{Config: cfg, Table: "baton-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer standby.Close(context.Background())
	for i := range 10 {
		go func() { _, _ = standby.Campaign(ctx, "cost-"+string(rune('a'+i)), baton.Candidate{ID: "s"}) }()
	}
	time.Sleep(2 * time.Second) // past the waiters' first reads and their sessions' creation
	hr, hw, wr, ww := hc.reads.Load(), hc.writes.Load(), wc.reads.Load(), wc.writes.Load()
	sr, sq := sc.reads.Load(), sc.requests.Load()
	start := time.Now()
	for b.Loop() {
		time.Sleep(benchci.Size(10*time.Second, 2*time.Second))
	}
	hours := time.Since(start).Hours()
	perHour := func(now, before int64) float64 { return float64(now-before) / hours }
	hW, hR := perHour(hc.writes.Load(), hw), perHour(hc.reads.Load(), hr)
	wW, wR := perHour(wc.writes.Load(), ww), perHour(wc.reads.Load(), wr)
	b.ReportMetric(hW, "holder-WRU/h")
	b.ReportMetric(hR, "holder-RRU/h")
	b.ReportMetric(wW, "waiter-WRU/h")
	b.ReportMetric(wR, "waiter-RRU/h")
	b.ReportMetric((hW*dollarsPerWRU+hR*dollarsPerRRU)*1e6, "holder-µ$/h")
	b.ReportMetric((wW*dollarsPerWRU+wR*dollarsPerRRU)*1e6, "waiter-µ$/h")
	b.ReportMetric(perHour(sc.reads.Load(), sr), "standby10-RRU/h")
	b.ReportMetric(perHour(sc.requests.Load(), sq), "standby10-req/h")
}

var _ = benchci.Register(BenchmarkDynamoDBStandby, "standby-req/s>0", "standby-req/poll>0", "standby-RRU/s>0")

// BenchmarkDynamoDBStandby: a standby process waiting for 10,000 leases
// that another process holds (TTL 10 s: a poll every 3.33 s). It reports
// the standby's requests per second and per poll, and its read units per
// second, over a window that starts once every waiter has read its lease
// by itself (the first read of a campaign); the process holds both
// Backends, so no CPU figure.
func BenchmarkDynamoDBStandby(b *testing.B) {
	n := benchci.Size(10000, 10)
	d := dynamoTable(b)
	cfg := backend.Config{TTL: 10 * time.Second}
	var hc, sc dynamoCounts
	holder, err := batondynamodb.New(context.Background(), dynamoClient(d.Endpoint, &hc), batondynamodb.Options{Config: cfg, Table: "baton-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer holder.Close(context.Background())
	name := func(i int) string { return fmt.Sprintf("standby-%05d", i) }
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := holder.Campaign(context.Background(), name(i), baton.Candidate{ID: "h"}); err != nil {
				b.Errorf("holder: %v", err)
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		return
	}
	standby, err := batondynamodb.New(context.Background(), dynamoClient(d.Endpoint, &sc), batondynamodb.Options{Config: cfg, Table: "baton-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer standby.Close(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	defer wg.Wait()
	defer cancel()
	for i := range n {
		wg.Go(func() { _, _ = standby.Campaign(ctx, name(i), baton.Candidate{ID: "s"}) })
	}
	// Each campaign reads its lease and the holder's session by itself
	// first: the window starts after those.
	testkit.Eventually(b, 10*time.Minute, "the standby's first reads", func() bool { return sc.reads.Load() >= int64(2*n) })
	filled, err := cfg.WithDefaults()
	if err != nil {
		b.Fatal(err)
	}
	poll := filled.RenewInterval // PollInterval's default
	var reqs, reads float64
	var wall time.Duration
	for b.Loop() {
		q0, r0, start := sc.requests.Load(), sc.reads.Load(), time.Now()
		time.Sleep(benchci.Size(10*time.Second, 4*time.Second)) // the measurement window itself
		wall = time.Since(start)
		reqs, reads = float64(sc.requests.Load()-q0), float64(sc.reads.Load()-r0)
	}
	b.ReportMetric(reqs/wall.Seconds(), "standby-req/s")
	b.ReportMetric(reqs/(wall.Seconds()/poll.Seconds()), "standby-req/poll")
	b.ReportMetric(reads/wall.Seconds(), "standby-RRU/s")
}
