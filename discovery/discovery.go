package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Discoverer finds the addresses (host:port) of instances that may be members
// of the group.
//
// Implementations must be safe for concurrent use. Peers returns a fresh
// slice that the caller may modify; an empty list with a nil error means the
// source currently names no instance.
type Discoverer interface {
	// Peers returns the addresses the source names now. ctx bounds this call
	// only.
	Peers(ctx context.Context) ([]string, error)

	// String describes the source in the form Parse accepts, such as
	// "static:a:7000,b:7000", "dns:peers.example.com:7000", or a Scheme's
	// ("aws-asg").
	String() string
}

// Spec schemes accepted by Parse.
const (
	schemeStatic = "static"
	schemeDNS    = "dns"
)

// builtinForms are the forms of the schemes built in, quoted by every Parse
// error about the shape of a spec.
var builtinForms = []string{"static:HOST[:PORT][,HOST[:PORT]...]", "dns:NAME[:PORT]", "dns:_SERVICE._PROTO.NAME"}

// acceptedForms lists the forms Parse accepts with opts, for its errors.
func acceptedForms(opts Options) string {
	forms := slices.Clone(builtinForms)
	for _, s := range opts.Schemes {
		forms = append(forms, s.Form)
	}
	return "want " + strings.Join(forms[:len(forms)-1], ", ") + " or " + forms[len(forms)-1]
}

// Options carries the settings that Parse hands to the Discoverer it builds.
// Each field is used only by its own scheme; the zero value is valid and
// means each scheme's defaults.
type Options struct {
	// DNS configures "dns:" specs.
	DNS DNSOptions

	// Schemes are further schemes Parse accepts, built outside this package
	// so that a program pays for their dependencies only when it uses them:
	// aws-asg, the members of an AWS Auto Scaling group, is the Scheme of
	// github.com/batonhq/baton/aws (aws.ASGScheme). Nil means the built-in
	// schemes only.
	Schemes []Scheme
}

// Scheme is a kind of spec that Parse hands to a builder outside this
// package.
type Scheme struct {
	// Name is the scheme: specs are "NAME" or "NAME:REST". Parse matches it
	// without regard to case; it must not be "static" or "dns".
	Name string

	// Form shows how the scheme's specs are written, such as
	// "aws-asg[:GROUP]"; Parse errors quote it.
	Form string

	// Build returns the Discoverer of a spec of this scheme. rest is what
	// follows "NAME:" and hasRest says whether the spec had the colon;
	// defaultPort is Parse's. Parse wraps its error in ErrInvalidSpec.
	Build func(rest string, hasRest bool, defaultPort int) (Discoverer, error)
}

// Parse builds the Discoverer that spec describes:
//
//	static:HOST[:PORT][,HOST[:PORT]...]   fixed addresses, in the order given
//	dns:NAME[:PORT]                        the A and AAAA records of NAME
//	dns:_SERVICE._PROTO.NAME               the SRV records of the name, with their ports
//
// and the specs of opts.Schemes, such as aws-asg[:GROUP] (the InService,
// Healthy members of an Auto Scaling group) of github.com/batonhq/baton/aws.
//
// defaultPort (1-65535, or 0 for none) is the port of every address whose spec
// gives none; a spec that needs a port and has none is an error. Parse does
// no I/O: a Discoverer contacts its source only when Peers is called.
//
// Errors wrap ErrInvalidSpec, and name the accepted forms when the scheme is
// unknown. For every Discoverer d that Parse returns, Parse(d.String(),
// defaultPort, opts) builds an equivalent one.
func Parse(spec string, defaultPort int, opts Options) (Discoverer, error) {
	if defaultPort < 0 || defaultPort > 65535 {
		return nil, fmt.Errorf("%w: default port %d is out of range 0-65535", ErrInvalidSpec, defaultPort)
	}
	spec = strings.TrimSpace(spec)
	scheme, rest, hasRest := strings.Cut(spec, ":")
	switch strings.ToLower(scheme) {
	case schemeStatic:
		if strings.TrimSpace(rest) == "" {
			return nil, fmt.Errorf("%w: %q lists no address; %s", ErrInvalidSpec, spec, acceptedForms(opts))
		}
		var addrs, problems []string
		for i, a := range strings.Split(rest, ",") {
			a = strings.TrimSpace(a)
			addr, err := canonicalAddr(a, defaultPort)
			if err != nil {
				problems = append(problems, fmt.Sprintf("entry %d: %v", i+1, err))
				continue
			}
			addrs = append(addrs, addr)
		}
		if len(problems) > 0 {
			return nil, fmt.Errorf("%w: %q: %s", ErrInvalidSpec, spec, strings.Join(problems, "; "))
		}
		return newStatic(addrs), nil

	case schemeDNS:
		rest = strings.TrimSpace(rest)
		if rest == "" {
			return nil, fmt.Errorf("%w: %q names no DNS name; %s", ErrInvalidSpec, spec, acceptedForms(opts))
		}
		name, port := rest, defaultPort
		if strings.HasPrefix(rest, "_") {
			if strings.Contains(rest, ":") {
				return nil, fmt.Errorf("%w: %q: an SRV name takes its ports from its records; drop the \":PORT\"", ErrInvalidSpec, spec)
			}
		} else {
			if h, p, ok := strings.Cut(rest, ":"); ok {
				n, err := parsePort(p)
				if err != nil {
					return nil, fmt.Errorf("%w: %q: %v", ErrInvalidSpec, spec, err)
				}
				name, port = h, n
			}
		}
		d, err := DNS(name, port, opts.DNS)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %w", ErrInvalidSpec, spec, err)
		}
		return d, nil

	default:
		for _, s := range opts.Schemes {
			if spec != "" && strings.EqualFold(scheme, s.Name) {
				d, err := s.Build(rest, hasRest, defaultPort)
				if err != nil {
					return nil, fmt.Errorf("%w: %q: %w", ErrInvalidSpec, spec, err)
				}
				return d, nil
			}
		}
		if spec == "" {
			return nil, fmt.Errorf("%w: empty spec; %s", ErrInvalidSpec, acceptedForms(opts))
		}
		return nil, fmt.Errorf("%w: unknown scheme %q in %q; %s", ErrInvalidSpec, scheme, spec, acceptedForms(opts))
	}
}

// Static returns a Discoverer that always names addrs. Each address must be
// "host:port" (IPv6 hosts in brackets) with a port in 1-65535; hosts are
// normalised (IP addresses to their canonical form, names to lower case),
// duplicates after the first are dropped, and the order is kept. Errors wrap
// ErrInvalidAddress and list every bad address at once.
func Static(addrs ...string) (Discoverer, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: Static needs at least one address", ErrInvalidAddress)
	}
	var canon, problems []string
	for _, a := range addrs {
		c, err := canonicalAddr(a, 0)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		canon = append(canon, c)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w: %s", ErrInvalidAddress, strings.Join(problems, "; "))
	}
	return newStatic(canon), nil
}

// static is the Discoverer of Static; its list never changes after creation,
// so it needs no lock.
type static struct {
	addrs []string
}

func newStatic(canon []string) *static {
	seen := make(map[string]bool, len(canon))
	s := &static{}
	for _, a := range canon {
		if !seen[a] {
			seen[a] = true
			s.addrs = append(s.addrs, a)
		}
	}
	return s
}

// Peers returns the fixed list. It never fails.
func (s *static) Peers(context.Context) ([]string, error) { return slices.Clone(s.addrs), nil }

// String returns "static:" and the addresses, comma-separated.
func (s *static) String() string { return schemeStatic + ":" + strings.Join(s.addrs, ",") }

// canonicalAddr validates s as HOST[:PORT] and returns it as "host:port" in
// canonical form. A bare host gets defaultPort; with defaultPort 0 a port is
// required.
func canonicalAddr(s string, defaultPort int) (string, error) {
	if s == "" {
		return "", fmt.Errorf("empty address")
	}
	var host, portStr string
	switch {
	case isIP(s):
		host = s // a bare IPv6 address has colons but no port
	case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
		host = s[1 : len(s)-1]
		if !isIP(host) {
			return "", fmt.Errorf("%q: %q in brackets is not an IPv6 address", s, host)
		}
	case strings.Contains(s, ":"):
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return "", fmt.Errorf("%q is not host:port (IPv6 addresses go in brackets, as in [::1]:7000)", s)
		}
		host, portStr = h, p
	default:
		host = s
	}

	canonHost, err := canonicalHost(host)
	if err != nil {
		return "", fmt.Errorf("%q: %w", s, err)
	}
	port := defaultPort
	if portStr != "" {
		if port, err = parsePort(portStr); err != nil {
			return "", fmt.Errorf("%q: %w", s, err)
		}
	} else if port == 0 {
		return "", fmt.Errorf("%q has no port, and there is no default port", s)
	}
	return net.JoinHostPort(canonHost, strconv.Itoa(port)), nil
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// canonicalHost returns an IP address in canonical form (IPv4-mapped IPv6
// addresses as IPv4) or a host name in lower case.
func canonicalHost(host string) (string, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		// netip accepts any zone; keep to interface names and numbers so
		// that the address survives being written out and parsed again.
		if z := a.Zone(); strings.Trim(z, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "" {
			return "", fmt.Errorf("IPv6 zone %q: want an interface name or number", z)
		}
		return a.Unmap().String(), nil
	}
	if err := checkHostname(host); err != nil {
		return "", err
	}
	return strings.ToLower(host), nil
}

// checkHostname accepts DNS names of letters, digits, '-' and '_' (the last
// for SRV-style labels), with labels of 1-63 characters, at most 253
// characters in all and an optional trailing dot. A last label of digits
// only is refused, so that a mistyped IPv4 address such as 10.0.0.256 is not
// taken for a name.
func checkHostname(name string) error {
	n := strings.TrimSuffix(name, ".")
	if n == "" {
		return fmt.Errorf("empty host")
	}
	if len(n) > 253 {
		return fmt.Errorf("host name is %d characters long, more than 253", len(n))
	}
	labels := strings.Split(n, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("host %q has a label of %d characters, want 1-63", name, len(l))
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("host %q has a label that begins or ends with '-'", name)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("host %q contains %q; want letters, digits, '-', '_' and '.'", name, c)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("host %q is neither an IP address nor a name (its last label is all digits)", name)
	}
	return nil
}

// parsePort accepts decimal digits only (no sign, no service names) in
// 1-65535.
func parsePort(p string) (int, error) {
	if p == "" {
		return 0, fmt.Errorf("empty port")
	}
	if len(p) > 5 || strings.Trim(p, "0123456789") != "" {
		return 0, fmt.Errorf("port %q is not a number in 1-65535", p)
	}
	n, _ := strconv.Atoi(p) // at most 5 digits: cannot overflow
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number in 1-65535", p)
	}
	return n, nil
}

func validPort(p int) bool { return p >= 1 && p <= 65535 }
