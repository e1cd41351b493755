package discovery_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is an authoritative DNS server on loopback UDP that answers A,
// AAAA and SRV questions from records the test sets, and NXDOMAIN for names
// it has no record of.
type dnsServer struct {
	conn net.PacketConn
	wg   sync.WaitGroup

	mu       sync.Mutex
	addrs    map[string][]netip.Addr // by lower-case name with a trailing dot
	srvs     map[string][]net.SRV
	servfail map[string]bool
	queries  int
}

func startDNSServer(t *testing.T) *dnsServer {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for DNS: %v", err)
	}
	s := &dnsServer{
		conn:     conn,
		addrs:    map[string][]netip.Addr{},
		srvs:     map[string][]net.SRV{},
		servfail: map[string]bool{},
	}
	s.wg.Add(1)
	go s.serve(t)
	t.Cleanup(func() {
		conn.Close()
		s.wg.Wait()
	})
	return s
}

func fqdn(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) + "." }

// setAddrs replaces the A and AAAA records of name.
func (s *dnsServer) setAddrs(name string, addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	s.addrs[fqdn(name)] = as
}

// setSRV replaces the SRV records of name.
func (s *dnsServer) setSRV(name string, recs ...net.SRV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srvs[fqdn(name)] = recs
}

// setServfail makes every question about name fail with SERVFAIL.
func (s *dnsServer) setServfail(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servfail[fqdn(name)] = true
}

func (s *dnsServer) queryCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

// resolver returns a pure-Go resolver that sends every query to s, whatever
// the system's resolv.conf says.
func (s *dnsServer) resolver() *net.Resolver {
	addr := s.conn.LocalAddr().String()
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", addr)
		},
	}
}

func (s *dnsServer) serve(t *testing.T) {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("DNS server read: %v", err)
			}
			return
		}
		resp, err := s.answer(buf[:n])
		if err != nil {
			t.Errorf("DNS server: %v", err)
			continue
		}
		if _, err := s.conn.WriteTo(resp, from); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("DNS server write: %v", err)
		}
	}
}

func (s *dnsServer) answer(query []byte) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	q, err := p.Question()
	if err != nil {
		return nil, err
	}
	name := strings.ToLower(q.Name.String())

	s.mu.Lock()
	s.queries++
	addrs, hasAddrs := s.addrs[name]
	srvs, hasSRVs := s.srvs[name]
	servfail := s.servfail[name]
	s.mu.Unlock()

	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case servfail:
		rh.RCode = dnsmessage.RCodeServerFailure
	case !hasAddrs && !hasSRVs:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if rh.RCode == dnsmessage.RCodeSuccess {
		rr := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}
		switch q.Type {
		case dnsmessage.TypeA:
			for _, a := range addrs {
				if a.Is4() {
					if err := b.AResource(rr, dnsmessage.AResource{A: a.As4()}); err != nil {
						return nil, err
					}
				}
			}
		case dnsmessage.TypeAAAA:
			for _, a := range addrs {
				if a.Is6() {
					if err := b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()}); err != nil {
						return nil, err
					}
				}
			}
		case dnsmessage.TypeSRV:
			for _, r := range srvs {
				target, err := dnsmessage.NewName(fqdn(r.Target))
				if err != nil {
					return nil, err
				}
				if err := b.SRVResource(rr, dnsmessage.SRVResource{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: target}); err != nil {
					return nil, err
				}
			}
		}
	}
	return b.Finish()
}
