package consul_test

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testkit"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

// TestACLToken runs against an agent with ACLs on and default_policy deny:
// without a token nothing works and the error says why; with a token of the
// policy the package doc gives, everything does.
func TestACLToken(t *testing.T) {
	t.Setenv("CONSUL_HTTP_TOKEN", "")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	agent := testserver.StartConsul(t, testserver.ConsulOptions{ACL: true})
	opts := consul.Options{Config: backend.Config{TTL: 2 * time.Second}, Prefix: "acl/"}

	anon, err := consul.NewClient(consul.ClientConfig{Address: agent.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, anon, opts, nil)
	_, err = b.Campaign(testkit.Context(t, 10*time.Second), "guarded", baton.Candidate{ID: "x"})
	if !errors.Is(err, consul.ErrPermissionDenied) || errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("Campaign without a token: err = %v; want ErrPermissionDenied (and not ErrBackendUnavailable)", err)
	}

	mgmt := agentClient(t, agent, agent.Addr())
	token := func(name, rules string) string {
		t.Helper()
		p, _, err := mgmt.ACL().PolicyCreate(&api.ACLPolicy{Name: name, Rules: rules}, nil)
		if err != nil {
			t.Fatalf("create policy %s: %v", name, err)
		}
		tok, _, err := mgmt.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
		if err != nil {
			t.Fatalf("create token: %v", err)
		}
		return tok.SecretID
	}
	// The policy of the package doc, for Prefix "acl/".
	good := token("baton", `
session_prefix "" { policy = "write" }
key_prefix "acl/" { policy = "write" }`)
	// Sessions, but only reading the keys: the reads go through, the lock
	// transaction is refused.
	keyless := token("baton-read-only", `
session_prefix "" { policy = "write" }
key_prefix "acl/" { policy = "read" }`)

	kc, err := consul.NewClient(consul.ClientConfig{Address: agent.Addr(), Token: keyless})
	if err != nil {
		t.Fatal(err)
	}
	b = newBackend(t, kc, opts, nil)
	_, err = b.Campaign(testkit.Context(t, 10*time.Second), "guarded", baton.Candidate{ID: "x"})
	if !errors.Is(err, consul.ErrPermissionDenied) || !strings.Contains(err.Error(), "key:write") {
		t.Errorf("Campaign with a token lacking key:write: err = %v; want ErrPermissionDenied naming key:write", err)
	}

	gc, err := consul.NewClient(consul.ClientConfig{Address: agent.Addr(), Token: good})
	if err != nil {
		t.Fatal(err)
	}
	b = newBackend(t, gc, opts, nil)
	term := testkit.CampaignWithin(t, b, "guarded", "x", 10*time.Second)
	rec, err := b.Leader(testkit.Context(t, 5*time.Second), "guarded")
	if err != nil || rec.Holder != "x" || rec.Token != term.Token() {
		t.Errorf("Leader = %+v, %v; want x with token %d", rec, err, term.Token())
	}
	recs, errs := b.Leaders(testkit.Context(t, 5*time.Second), []string{"guarded", "free"})
	if errs[0] != nil || recs[0] != rec || !errors.Is(errs[1], baton.ErrNoLeader) {
		t.Errorf("Leaders = %+v, %v; want %+v and no leader", recs, errs, rec)
	}
	// A token that may not read the keys: Consul leaves them out of a
	// read-only transaction's answer; Leaders says so, as Leader does.
	ab := newBackend(t, anon, opts, nil)
	if _, err := ab.Leader(testkit.Context(t, 5*time.Second), "guarded"); !errors.Is(err, consul.ErrPermissionDenied) {
		t.Errorf("Leader without a token: err = %v; want ErrPermissionDenied", err)
	}
	if _, errs := ab.Leaders(testkit.Context(t, 5*time.Second), []string{"guarded", "free"}); !errors.Is(errs[0], consul.ErrPermissionDenied) || !errors.Is(errs[1], consul.ErrPermissionDenied) {
		t.Errorf("Leaders without a token: errs = %v; want ErrPermissionDenied for each", errs)
	}
	// Renewals go through with the token: the term outlives its first
	// safe-until.
	first := term.SafeUntil()
	testkit.EventuallyErr(t, 5*time.Second, "a renewal with the token", func() error {
		if err := term.Err(); err != nil {
			t.Fatalf("term ended: %v", err)
		}
		if !term.SafeUntil().After(first) {
			return errors.New("no renewal yet")
		}
		return nil
	})
	// The lease's state is under the prefix too.
	st, ok := term.(baton.StateTerm)
	if !ok {
		t.Fatalf("term %T is not a baton.StateTerm", term)
	}
	if err := st.StoreState(testkit.Context(t, 5*time.Second), []byte("v1")); err != nil {
		t.Errorf("StoreState with the package doc's policy: %v", err)
	}
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Errorf("Resign: %v", err)
	}

	// A token that may lock but only read the state key: StoreState is
	// refused with ErrPermissionDenied, which is no loss of the lease.
	stateless := token("baton-stateless", `
session_prefix "" { policy = "write" }
key_prefix "acl/" { policy = "write" }
key "acl/guarded/.baton-state" { policy = "read" }`)
	sc, err := consul.NewClient(consul.ClientConfig{Address: agent.Addr(), Token: stateless})
	if err != nil {
		t.Fatal(err)
	}
	b = newBackend(t, sc, opts, nil)
	st, _ = testkit.CampaignWithin(t, b, "guarded", "y", 10*time.Second).(baton.StateTerm)
	err = st.StoreState(testkit.Context(t, 5*time.Second), []byte("v2"))
	if !errors.Is(err, consul.ErrPermissionDenied) || errors.Is(err, baton.ErrLeaseLost) || errors.Is(err, baton.ErrBackendUnavailable) {
		t.Errorf("StoreState without key:write on the state key: err = %v; want ErrPermissionDenied only", err)
	}
	if err := st.Err(); err != nil {
		t.Errorf("a refused StoreState ended the term: %v", err)
	}
	if v, err := st.LoadState(testkit.Context(t, 5*time.Second)); err != nil || string(v) != "v1" {
		t.Errorf("LoadState = %q, %v; want %q", v, err, "v1")
	}
	if err := st.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Errorf("Resign: %v", err)
	}
}

// TestTLS runs against an agent that serves HTTPS only and requires client
// certificates.
func TestTLS(t *testing.T) {
	for _, env := range []string{"CONSUL_HTTP_SSL", "CONSUL_CACERT", "CONSUL_CAPATH", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY", "CONSUL_HTTP_ADDR"} {
		t.Setenv(env, "")
	}
	agent := testserver.StartConsul(t, testserver.ConsulOptions{TLS: true})
	ca, cert, key := agent.TLSFiles()
	opts := consul.Options{Config: backend.Config{TTL: 2 * time.Second}, Prefix: "tls/"}

	c, err := consul.NewClient(consul.ClientConfig{Address: agent.Addr(), CAFile: ca, CertFile: cert, KeyFile: key})
	if err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, c, opts, nil)
	term := testkit.CampaignWithin(t, b, "secure", "x", 10*time.Second)
	if err := term.Resign(testkit.Context(t, 5*time.Second)); err != nil {
		t.Errorf("Resign: %v", err)
	}

	// The same through a backend URL, as the CLI gets it.
	cc, uopts, err := consul.ParseURL(fmt.Sprintf("consul://%s/tls/url?ca-file=%s&cert-file=%s&key-file=%s", agent.Addr(), ca, cert, key))
	if err != nil {
		t.Fatal(err)
	}
	if c, err = consul.NewClient(cc); err != nil {
		t.Fatal(err)
	}
	uopts.Config = opts.Config
	b = newBackend(t, c, uopts, nil)
	testkit.CampaignWithin(t, b, "secure", "y", 10*time.Second)
	if p, _, err := agentClient(t, agent, agent.Addr()).KV().Get("tls/url/secure/.lock", nil); err != nil || p == nil || string(p.Value) != "y" {
		t.Errorf("tls/url/secure/.lock = %+v, %v; want y's lock", p, err)
	}

	// Without the client certificate, or without the CA, the agent is out
	// of reach.
	for name, cc := range map[string]consul.ClientConfig{
		"no client certificate": {Address: agent.Addr(), CAFile: ca},
		"no CA":                 {Address: agent.Addr(), TLS: true, CertFile: cert, KeyFile: key},
	} {
		c, err := consul.NewClient(cc)
		if err != nil {
			t.Fatal(err)
		}
		b := newBackend(t, c, opts, nil)
		if _, err := b.Campaign(testkit.Context(t, 10*time.Second), "secure", baton.Candidate{ID: "z"}); !errors.Is(err, baton.ErrBackendUnavailable) {
			t.Errorf("%s: Campaign err = %v, want ErrBackendUnavailable", name, err)
		}
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url    string
		cc     consul.ClientConfig
		prefix string
		err    string
	}{
		{url: "consul://10.0.0.1:8500", cc: consul.ClientConfig{Address: "10.0.0.1:8500"}},
		{url: "consul://10.0.0.1:8500/", cc: consul.ClientConfig{Address: "10.0.0.1:8500"}},
		{url: "consul://10.0.0.1:8500/service", cc: consul.ClientConfig{Address: "10.0.0.1:8500"}, prefix: "service/"},
		{url: "consul://10.0.0.1:8500/a/b/", cc: consul.ClientConfig{Address: "10.0.0.1:8500"}, prefix: "a/b/"},
		{url: "consul:///jobs", prefix: "jobs/"},
		{
			url: "consul://c.example:8501/?tls=true&ca-file=/ca.pem&cert-file=/c.pem&key-file=/k.pem&tls-server-name=consul&token-file=/tok&dc=eu",
			cc: consul.ClientConfig{Address: "c.example:8501", TLS: true, CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem",
				TLSServerName: "consul", TokenFile: "/tok", Datacenter: "eu"},
		},
		{url: "consul://h:1/?compress=true", cc: consul.ClientConfig{Address: "h:1", Compress: true}},
		{url: "consul://h:1/?compress=yes", err: "compress=\"yes\" is not a boolean"},
		{url: "consul://h:1/?token=secret", err: "token-file"},
		{url: "consul://h:1/?bogus=1", err: "unknown parameter"},
		{url: "consul://u:p@h:1/", err: "user information"},
		{url: "etcd://h:1/", err: "scheme"},
	} {
		cc, opts, err := consul.ParseURL(tc.url)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURL(%q): err = %v; want one mentioning %q", tc.url, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(cc, tc.cc) || opts.Prefix != tc.prefix {
			t.Errorf("ParseURL(%q) = %+v, prefix %q, %v; want %+v, prefix %q", tc.url, cc, opts.Prefix, err, tc.cc, tc.prefix)
		}
	}
}

func TestNewClientRefusesContradictions(t *testing.T) {
	if _, err := consul.NewClient(consul.ClientConfig{Address: "http://127.0.0.1:8500", CAFile: "/ca.pem"}); err == nil {
		t.Error("NewClient accepted an http:// address with TLS files")
	}
	if _, err := consul.NewClient(consul.ClientConfig{Address: "127.0.0.1:8500", CertFile: "/c.pem"}); err == nil {
		t.Error("NewClient accepted a client certificate without a key")
	}
}

// TestNewClientAsksForPlainAnswers: a client from NewClient asks the agent
// for uncompressed answers unless ClientConfig.Compress is set. The agent
// compresses an answer only when asked, and compressing a Backend's largest
// answers, its watch's lists, costs the agent more CPU than reading them;
// Go's HTTP client asks by default, as a client from api.NewClient shows
// here.
func TestNewClientAsksForPlainAnswers(t *testing.T) {
	agent := testserver.SharedConsul(t)
	caFile, certFile, keyFile := agent.TLSFiles()
	for _, tc := range []struct {
		name  string
		plain bool
		new   func(addr string) (*api.Client, error)
	}{
		{"NewClient", true, func(addr string) (*api.Client, error) {
			return consul.NewClient(consul.ClientConfig{Address: addr, Token: agent.ManagementToken(), CAFile: caFile, CertFile: certFile, KeyFile: keyFile})
		}},
		{"NewClient with Compress", false, func(addr string) (*api.Client, error) {
			return consul.NewClient(consul.ClientConfig{Address: addr, Token: agent.ManagementToken(), CAFile: caFile, CertFile: certFile, KeyFile: keyFile, Compress: true})
		}},
		{"api.NewClient", false, func(addr string) (*api.Client, error) { return agentClient(t, agent, addr), nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if caFile != "" {
				t.Skip("the agent speaks TLS: the proxy cannot read the requests")
			}
			proxy := testserver.StartProxy(t, agent.Addr())
			// Every request the proxy forwards, as the agent receives it.
			var log testserver.SyncBuffer
			proxy.TapClient(func() io.Writer { return &log })
			c, err := tc.new(proxy.Addr())
			if err != nil {
				t.Fatal(err)
			}
			prefix := testPrefix()
			if _, _, err := c.KV().List(prefix, nil); err != nil {
				t.Fatal(err)
			}
			b := newBackend(t, c, consul.Options{Prefix: prefix}, nil)
			testkit.CampaignWithin(t, b, "plain", "x", 10*time.Second)
			reqs := log.String()
			if !strings.Contains(reqs, "/v1/kv/"+prefix) {
				t.Fatalf("the proxy saw no request for the prefix; requests:\n%s", reqs)
			}
			asked := strings.Contains(strings.ToLower(reqs), "accept-encoding: gzip")
			if asked == tc.plain {
				t.Errorf("requests ask for gzip: %v; want %v", asked, !tc.plain)
			}
		})
	}
}
