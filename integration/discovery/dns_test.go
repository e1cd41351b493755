package discovery_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/batonhq/baton/discovery"
)

func TestDNSAddresses(t *testing.T) {
	s := startDNSServer(t)
	s.setAddrs("peers.example.test", "10.0.0.2", "10.0.0.1", "fd00::1", "::ffff:10.0.0.1")

	d, err := discovery.DNS("peers.example.test", 7000, discovery.DNSOptions{Resolver: s.resolver()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Peers(context.Background())
	if err != nil {
		t.Fatalf("Peers: %v", err)
	}
	want := []string{"10.0.0.1:7000", "10.0.0.2:7000", "[fd00::1]:7000"}
	if !slices.Equal(got, want) {
		t.Errorf("Peers = %q, want %q (sorted, IPv4 first, duplicates dropped)", got, want)
	}
	if d.String() != "dns:peers.example.test:7000" {
		t.Errorf("String = %q", d.String())
	}

	// No cache of its own: a changed record is seen at once (the test
	// server's TTL is one second and the Go resolver does not cache).
	s.setAddrs("peers.example.test", "10.0.0.3")
	got, err = d.Peers(context.Background())
	if err != nil || !slices.Equal(got, []string{"10.0.0.3:7000"}) {
		t.Errorf("after the records changed, Peers = %q, %v; want [10.0.0.3:7000]", got, err)
	}
}

func TestDNSSRV(t *testing.T) {
	s := startDNSServer(t)
	s.setSRV("_baton._tcp.example.test",
		net.SRV{Target: "node-b.example.test", Port: 7002, Priority: 10, Weight: 5},
		net.SRV{Target: "node-a.example.test", Port: 7001, Priority: 10, Weight: 5},
		net.SRV{Target: "gone.example.test", Port: 7003, Priority: 20},   // NXDOMAIN: skipped
		net.SRV{Target: "node-a.example.test", Port: 7001, Priority: 30}, // duplicate
		net.SRV{Target: "node-a.example.test", Port: 7100, Priority: 30}, // same host, other port: kept
	)
	s.setAddrs("node-a.example.test", "10.0.1.1", "fd00::a")
	s.setAddrs("node-b.example.test", "10.0.1.2")

	// Through Parse, as the raft backend will build it; the default port is
	// ignored in favour of the records' ports.
	d, err := discovery.Parse("dns:_baton._tcp.example.test", 9999, discovery.Options{DNS: discovery.DNSOptions{Resolver: s.resolver()}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Peers(context.Background())
	if err != nil {
		t.Fatalf("Peers: %v", err)
	}
	want := []string{"10.0.1.1:7001", "10.0.1.1:7100", "10.0.1.2:7002", "[fd00::a]:7001", "[fd00::a]:7100"}
	if !slices.Equal(got, want) {
		t.Errorf("Peers = %q, want %q", got, want)
	}
	if d.String() != "dns:_baton._tcp.example.test" {
		t.Errorf("String = %q", d.String())
	}
}

func TestDNSNotFound(t *testing.T) {
	s := startDNSServer(t)
	for _, name := range []string{"missing.example.test", "_missing._tcp.example.test"} {
		t.Run(name, func(t *testing.T) {
			d, err := discovery.DNS(name, 7000, discovery.DNSOptions{Resolver: s.resolver()})
			if err != nil {
				t.Fatal(err)
			}
			got, err := d.Peers(context.Background())
			if err == nil {
				t.Fatalf("Peers = %q, want an error for NXDOMAIN", got)
			}
			var dnsErr *net.DNSError
			if !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
				t.Errorf("error %v does not wrap a not-found *net.DNSError", err)
			}
			if !strings.Contains(err.Error(), name) {
				t.Errorf("error %q does not name what was looked up", err)
			}
		})
	}
	if s.queryCount() == 0 {
		t.Error("the test server saw no query: the resolver went elsewhere")
	}
}

func TestDNSSRVTargetFailure(t *testing.T) {
	// A target that exists but cannot be resolved now (SERVFAIL) fails the
	// call: skipping it would shrink the list for a passing fault.
	s := startDNSServer(t)
	s.setSRV("_baton._tcp.example.test",
		net.SRV{Target: "node-a.example.test", Port: 7001},
		net.SRV{Target: "broken.example.test", Port: 7002},
	)
	s.setAddrs("node-a.example.test", "10.0.1.1")
	s.setServfail("broken.example.test")

	d, err := discovery.DNS("_baton._tcp.example.test", 0, discovery.DNSOptions{Resolver: s.resolver()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Peers(context.Background())
	if err == nil {
		t.Fatalf("Peers = %q, want an error for the SERVFAIL target", got)
	}
	if !strings.Contains(err.Error(), "broken.example.test") {
		t.Errorf("error %q does not name the failing target", err)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		t.Errorf("SERVFAIL reported as not found: %v", err)
	}
}

func TestDNSEmptySRV(t *testing.T) {
	// Every target gone: an empty list, not an error, as for an empty group.
	s := startDNSServer(t)
	s.setSRV("_baton._tcp.example.test",
		net.SRV{Target: "gone.example.test", Port: 7001},
	)
	d, err := discovery.DNS("_baton._tcp.example.test", 0, discovery.DNSOptions{Resolver: s.resolver()})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Peers(context.Background())
	if err != nil || len(got) != 0 {
		t.Errorf("Peers = %q, %v; want an empty list", got, err)
	}
}
