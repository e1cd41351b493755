package dynamodb_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	batondynamodb "github.com/batonhq/baton/backend/dynamodb"
	"github.com/batonhq/baton/batontest"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
)

// action is what a faultProxy does with one request.
type action int

const (
	pass      action = iota
	loseReply        // forward it, then close the connection without the reply
	deny             // answer AccessDeniedException without forwarding it
)

// faultProxy is an HTTP proxy in front of dynalite that sees each
// DynamoDB request (its operation, from X-Amz-Target, and its JSON body)
// and can lose its reply or refuse it.
type faultProxy struct {
	target string

	mu     sync.Mutex
	decide func(op string, body []byte) action
	ops    map[string]int // requests seen, by operation
	srv    *httptest.Server
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	p := &faultProxy{target: target, ops: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

// Endpoint is the proxy's URL.
func (p *faultProxy) Endpoint() string { return p.srv.URL }

// set installs decide for the requests from now on.
func (p *faultProxy) set(decide func(op string, body []byte) action) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.decide = decide
}

// count returns how many requests of op the proxy has seen.
func (p *faultProxy) count(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ops[op]
}

func (p *faultProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	p.mu.Lock()
	p.ops[op]++
	act := pass
	if p.decide != nil {
		act = p.decide(op, body)
	}
	p.mu.Unlock()
	if act == deny {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"__type":"com.amazon.coral.service#AccessDeniedException","Message":"User: arn:aws:sts::123456789012:assumed-role/app/i-0abc is not authorized to perform: dynamodb:`+op+` on resource: table because no identity-based policy allows it"}`)
		return
	}
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(resp.Body)
	if act == loseReply {
		// The request landed; its reply is lost with the connection.
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(reply)
}

// clientVia returns a client of endpoint that makes at most attempts
// attempts per request (the SDK's default is 3).
func clientVia(endpoint string, attempts int) *dynamodb.Client {
	c := newClient(endpoint)
	return dynamodb.New(c.Options(), func(o *dynamodb.Options) { o.RetryMaxAttempts = attempts })
}

// acquisition reports whether body is an UpdateItem that acquires a lease.
func acquisition(op string, body []byte) bool {
	return op == "UpdateItem" && bytes.Contains(body, []byte(`"pk":{"S":"lease:`)) && bytes.Contains(body, []byte("ADD #tok"))
}

func newBackend(t *testing.T, client *dynamodb.Client, table string, cfg backend.Config) *batondynamodb.Backend {
	t.Helper()
	b, err := batondynamodb.New(context.Background(), client, batondynamodb.Options{Config: cfg, Table: table, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b
}

// TestLostAcquisitionReplyAdopted: an acquisition lands but its reply is
// lost, once. The campaign must still win, with the token it wrote, which
// is one above the last term's: neither mistaken for a loss (an error, a
// campaign that waits) nor taken again with a second token.
func TestLostAcquisitionReplyAdopted(t *testing.T) {
	d, table := startTable(t)
	for _, tc := range []struct {
		name     string
		attempts int
	}{
		// The reply is lost and nothing retries: the error reaches the
		// Backend, which reads the item back.
		{"NoRetry", 1},
		// The SDK retries; the retry's condition fails on the first
		// attempt's own write.
		{"SDKRetry", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startFaultProxy(t, d.Endpoint)
			b := newBackend(t, clientVia(p.Endpoint(), tc.attempts), table, backend.Config{TTL: 5 * time.Second})
			lease := "lost-" + tc.name
			first := testkit.CampaignWithin(t, b, lease, "a", 30*time.Second)
			prev := first.Token()
			if err := first.Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			p.set(func(op string, body []byte) action {
				act := pass
				if acquisition(op, body) {
					once.Do(func() { act = loseReply })
				}
				return act
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			term, err := b.Campaign(ctx, lease, baton.Candidate{ID: "a"})
			if err != nil {
				t.Fatalf("campaign whose acquisition's reply was lost: %v; want the term it won", err)
			}
			defer term.Resign(context.Background())
			if term.Token() != prev+1 {
				t.Errorf("token %d after a term of %d: want %d, the token of the one acquisition that landed", term.Token(), prev, prev+1)
			}
			rec, err := b.Leader(ctx, lease)
			if err != nil || rec.Token != term.Token() || rec.Holder != "a" {
				t.Errorf("Leader = %+v, %v; want a with token %d", rec, err, term.Token())
			}
		})
	}
}

// TestOneWritePerRenewInterval: a process holding 50 leases writes once per
// renew interval (its session item), not once per lease; a waiter reads
// twice per poll and writes nothing.
func TestOneWritePerRenewInterval(t *testing.T) {
	d, table := startTable(t)
	holderP := startFaultProxy(t, d.Endpoint)
	cfg := backend.Config{TTL: 3 * time.Second}
	holder := newBackend(t, clientVia(holderP.Endpoint(), 3), table, cfg)
	const n = 50
	for i := range n {
		term := testkit.CampaignWithin(t, holder, "many-"+string(rune('a'+i/26))+string(rune('a'+i%26)), "h", 30*time.Second)
		defer term.Resign(context.Background())
	}
	waiterP := startFaultProxy(t, d.Endpoint)
	waiter, err := batondynamodb.New(context.Background(), clientVia(waiterP.Endpoint(), 3), batondynamodb.Options{Config: cfg, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(context.Background())
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	go func() { _, _ = waiter.Campaign(wctx, "many-aa", baton.Candidate{ID: "w"}) }()

	writes := func() int { return holderP.count("UpdateItem") + holderP.count("PutItem") }
	start := writes()
	const renewals = 5
	testkit.Eventually(t, time.Minute, "five more renewals", func() bool { return writes() >= start+renewals })
	got := writes() - start
	if got > renewals {
		t.Errorf("%d writes while the %d leases were renewed %d times: want one write per renewal, whatever the number of leases", got, n, renewals)
	}
	testkit.Eventually(t, time.Minute, "the waiter to poll", func() bool { return waiterP.count("GetItem")+waiterP.count("BatchGetItem") >= 6 })
	wcancel()
	if w := waiterP.count("UpdateItem"); w > renewals+2 {
		t.Errorf("the waiter wrote %d times; want only its own session's renewals", w)
	}
}

// TestMissingTable: New on a table that does not exist fails with a
// *TableError, a *baton.ConfigError (exit 2), that says how to create it.
func TestMissingTable(t *testing.T) {
	d := testserver.StartDynalite(t)
	_, err := batondynamodb.New(context.Background(), newClient(d.Endpoint), batondynamodb.Options{Table: "no-such-table"})
	var te *batondynamodb.TableError
	if !errors.As(err, &te) || !errors.As(err, new(*baton.ConfigError)) || !strings.Contains(err.Error(), "create-table") {
		t.Fatalf("New on a missing table: %v; want a *TableError matching *baton.ConfigError that names create-table", err)
	}
}

// TestAccessDenied: a role the policy does not allow fails New, and a
// campaign of a Backend that skipped the check, with a *baton.ConfigError,
// not an outage to retry forever.
func TestAccessDenied(t *testing.T) {
	d, table := startTable(t)
	p := startFaultProxy(t, d.Endpoint)
	p.set(func(string, []byte) action { return deny })
	_, err := batondynamodb.New(context.Background(), newClient(p.Endpoint()), batondynamodb.Options{Table: table})
	if !errors.As(err, new(*baton.ConfigError)) || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("New when access is denied: %v; want a *baton.ConfigError saying access denied", err)
	}
	b, err := batondynamodb.New(context.Background(), newClient(p.Endpoint()), batondynamodb.Options{Table: table, NoCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = b.Campaign(ctx, "denied", baton.Candidate{ID: "a"})
	if !errors.As(err, new(*baton.ConfigError)) {
		t.Fatalf("campaign when access is denied: %v; want a *baton.ConfigError", err)
	}
}

// TestTokensRiseAcrossDataLoss: the table is lost (a new emulator, a new
// empty table behind the same address); tokens still rise.
func TestTokensRiseAcrossDataLoss(t *testing.T) {
	d, table := startTable(t)
	proxy := testserver.StartProxy(t, d.Addr)
	endpoint := "http://" + proxy.Addr()
	batontest.TokensRiseAcrossDataLoss(t, batontest.DataLoss{
		New: func(t *testing.T, logger *slog.Logger) baton.Backend {
			b, err := batondynamodb.New(context.Background(), newClient(endpoint), batondynamodb.Options{Config: backend.Config{TTL: time.Second}, Table: table, Logger: logger})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			return b
		},
		Lose: func(t *testing.T) {
			d.Stop()
			d = testserver.StartDynalite(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := batondynamodb.CreateTable(ctx, newClient(d.Endpoint), table); err != nil {
				t.Fatal(err)
			}
			proxy.Retarget(d.Addr)
		},
	})
}

// item reads an item of the table directly.
func item(t *testing.T, c *dynamodb.Client, table, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := c.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{batondynamodb.KeyAttribute: &types.AttributeValueMemberS{Value: key}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

// TestReleaseKeepsItemAndToken: a release never deletes the lease's item;
// the token stays, so the next term's is above it.
func TestReleaseKeepsItemAndToken(t *testing.T) {
	d, table := startTable(t)
	c := newClient(d.Endpoint)
	b := newBackend(t, c, table, backend.Config{TTL: 2 * time.Second})
	term := testkit.CampaignWithin(t, b, "kept", "a", 30*time.Second)
	if err := term.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	it := item(t, c, table, batondynamodb.LeasePrefix+"kept")
	tok, ok := it["token"].(*types.AttributeValueMemberN)
	if !ok || tok.Value == "" {
		t.Fatalf("lease item after a release: %v; want it kept with its token", it)
	}
	if _, held := it["holder"]; held {
		t.Errorf("lease item after a release still names a holder: %v", it)
	}
	next := testkit.CampaignWithin(t, b, "kept", "b", 30*time.Second)
	defer next.Resign(context.Background())
	if next.Token() <= term.Token() {
		t.Errorf("token %d after %d", next.Token(), term.Token())
	}
}
