package bench

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/consul"
	"github.com/batonhq/baton/internal/testserver"
	"github.com/hashicorp/consul/api"
)

func init() { targets = append(targets, namedTarget{"consul", consulTarget}) }

// consulTarget runs against one real `consul agent -dev` (v1.20.6, built
// from the tools module); every simulated process has its own client
// behind its own proxy, so that killing a process cuts it off without
// destroying its session, as kill -9 would. The agent's session_ttl_min is
// lowered so that the one-second failover TTL is allowed.
func consulTarget(b *testing.B) target {
	srv := testserver.StartConsul(b, testserver.ConsulOptions{})
	var n atomic.Int64
	return target{
		name: "consul",
		new: func(b *testing.B, cfg backend.Config) *process {
			proxy := testserver.StartProxy(b, srv.Addr())
			tr := http.DefaultTransport.(*http.Transport).Clone()
			client, err := api.NewClient(&api.Config{
				Address:    proxy.Addr(),
				HttpClient: &http.Client{Transport: countingRoundTripper{tr, &n}},
			})
			if err != nil {
				b.Fatal(err)
			}
			be, err := consul.New(client, consul.Options{Config: cfg})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = be.Close(ctx)
				tr.CloseIdleConnections()
			})
			return &process{backend: be, kill: proxy.Cut}
		},
		requests: n.Load,
	}
}

// countingRoundTripper counts HTTP requests; a blocking query is one.
type countingRoundTripper struct {
	http.RoundTripper
	n *atomic.Int64
}

func (c countingRoundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.RoundTripper.RoundTrip(r)
}
