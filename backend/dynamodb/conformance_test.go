package dynamodb_test

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/batonhq/baton/backend"
	batondynamodb "github.com/batonhq/baton/backend/dynamodb"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testserver"
)

// newClient returns a DynamoDB client of endpoint, with made-up
// credentials (dynalite checks none) and connections of its own.
func newClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "AKIDBATONTEST", SecretAccessKey: "secret"}, nil
		}),
		HTTPClient: &http.Client{Transport: &http.Transport{}},
	})
}

// startTable starts dynalite with baton's table in it.
func startTable(t *testing.T) (*testserver.DynaliteProc, string) {
	t.Helper()
	d := testserver.StartDynalite(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := batondynamodb.CreateTable(ctx, newClient(d.Endpoint), "baton-leases"); err != nil {
		t.Fatal(err)
	}
	return d, "baton-leases"
}

// TestConformance runs the whole conformance suite on dynalite, each
// process through a proxy of its own (to cut it off).
func TestConformance(t *testing.T) {
	d, table := startTable(t)
	batontest.Run(t, target(d, table))
}

// target is the conformance suite's Target on table.
func target(d *testserver.DynaliteProc, table string) batontest.Target {
	return batontest.Target{
		OneCampaignPerName: true,
		KeepsKilledHolder:  true,
		New: func(t *testing.T, cfg backend.Config) *batontest.Process {
			proxy := testserver.StartProxy(t, d.Addr)
			client := newClient("http://" + proxy.Addr())
			b, err := batondynamodb.New(context.Background(), client, batondynamodb.Options{Config: cfg, Table: table, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = b.Close(ctx)
			})
			var once sync.Once
			killed := make(chan struct{})
			return &batontest.Process{
				Backend: b,
				// A process killed with -9 sends nothing more: cut it off
				// for good.
				Kill: func() {
					once.Do(func() {
						close(killed)
						proxy.Cut()
					})
				},
				Cut: proxy.Cut,
				Heal: func() {
					select {
					case <-killed:
					default:
						proxy.Heal()
					}
				},
			}
		},
	}
}

// testLogger logs to the test when BATON_TEST_LOG is set.
func testLogger(t *testing.T) *slog.Logger {
	if os.Getenv("BATON_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestLeaderWatch: a process that only watches hears each holder in turn,
// by polling (a killed holder until its successor took over).
func TestLeaderWatch(t *testing.T) {
	d, table := startTable(t)
	batontest.LeaderWatch(t, target(d, table))
}
