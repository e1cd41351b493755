package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// DNSOptions configures DNS. The zero value uses the system resolver.
type DNSOptions struct {
	// Resolver answers the queries. Nil (the default) means
	// net.DefaultResolver. The caller owns it.
	Resolver *net.Resolver
}

// DNS returns a Discoverer that looks name up on every call to Peers; it
// keeps no cache of its own, so answers are as fresh as the resolver's.
//
// A name beginning with '_' (such as "_baton._tcp.example.com") is looked up
// as SRV records: each record's target is resolved to its IP addresses, which
// are paired with the record's port, and port is ignored. A target that does
// not exist (NXDOMAIN) is skipped, since an SRV record may outlive its host;
// any other failure fails the call. A target of "." (service explicitly not
// available) is skipped.
//
// Any other name is looked up as A and AAAA records, each paired with port,
// which must be in 1-65535.
//
// Peers returns the addresses sorted (IPv4 before IPv6) and without
// duplicates, so that the same answer in a different order gives the same
// list. Lookup errors wrap the resolver's *net.DNSError; use its IsNotFound
// to tell a missing name from an unreachable server. DNS itself fails only on
// a malformed name or port, with an error wrapping ErrInvalidAddress.
func DNS(name string, port int, opts DNSOptions) (Discoverer, error) {
	srv := strings.HasPrefix(name, "_")
	if err := checkHostname(name); err != nil {
		return nil, fmt.Errorf("%w: DNS name %q: %w", ErrInvalidAddress, name, err)
	}
	if !srv && !validPort(port) {
		return nil, fmt.Errorf("%w: DNS name %q needs a port in 1-65535, got %d", ErrInvalidAddress, name, port)
	}
	if srv {
		port = 0
	}
	r := opts.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	return &dnsDiscoverer{name: strings.ToLower(name), port: port, srv: srv, r: r}, nil
}

// dnsDiscoverer is the Discoverer of DNS. Its fields never change after
// creation; net.Resolver is safe for concurrent use.
type dnsDiscoverer struct {
	name string
	port int // 0 for SRV
	srv  bool
	r    *net.Resolver
}

// String returns "dns:NAME:PORT", or "dns:NAME" for an SRV name.
func (d *dnsDiscoverer) String() string {
	if d.srv {
		return schemeDNS + ":" + d.name
	}
	return schemeDNS + ":" + d.name + ":" + strconv.Itoa(d.port)
}

// Peers looks the name up; see DNS.
func (d *dnsDiscoverer) Peers(ctx context.Context) ([]string, error) {
	type hostPort struct {
		ip   netip.Addr
		port uint16
	}
	var found []hostPort
	if d.srv {
		_, recs, err := d.r.LookupSRV(ctx, "", "", d.name)
		if err != nil {
			return nil, fmt.Errorf("discovery: SRV lookup of %s: %w", d.name, err)
		}
		for _, rec := range recs {
			if rec.Target == "." || rec.Target == "" || rec.Port == 0 {
				continue
			}
			ips, err := d.r.LookupNetIP(ctx, "ip", rec.Target)
			if err != nil {
				var dnsErr *net.DNSError
				if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
					continue
				}
				return nil, fmt.Errorf("discovery: SRV lookup of %s: resolving target %s: %w", d.name, rec.Target, err)
			}
			for _, ip := range ips {
				found = append(found, hostPort{ip.Unmap(), rec.Port})
			}
		}
	} else {
		ips, err := d.r.LookupNetIP(ctx, "ip", d.name)
		if err != nil {
			return nil, fmt.Errorf("discovery: address lookup of %s: %w", d.name, err)
		}
		for _, ip := range ips {
			found = append(found, hostPort{ip.Unmap(), uint16(d.port)})
		}
	}

	slices.SortFunc(found, func(a, b hostPort) int {
		if c := a.ip.Compare(b.ip); c != 0 {
			return c
		}
		return int(a.port) - int(b.port)
	})
	found = slices.Compact(found)
	addrs := make([]string, len(found))
	for i, hp := range found {
		addrs[i] = netip.AddrPortFrom(hp.ip, hp.port).String()
	}
	return addrs, nil
}
