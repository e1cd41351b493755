package backendurl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// escapeHint tells how to write what a bad % escape was meant to be.
const escapeHint = "write a literal % as %25"

// splitURL separates scheme://[user[:password]@]authority[/path][?query]
// without url.Parse's checks of the authority, decoding the user
// information and path as url.Parse would. The authority is left as it is
// for checkURLParts, which refuses a % in it.
func splitURL(raw string) (*url.URL, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	if strings.ContainsAny(rest, " \t\n") {
		return nil, errors.New("it contains white space")
	}
	rest, query, _ := strings.Cut(rest, "?")
	host, path, hasPath := strings.Cut(rest, "/")
	var user *url.Userinfo
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		u, p, hasP := strings.Cut(host[:at], ":")
		var err error
		if u, err = url.PathUnescape(u); err != nil {
			return nil, fmt.Errorf("user name: %v: %s", err, escapeHint)
		}
		if hasP {
			if p, err = url.PathUnescape(p); err != nil {
				// Not the password itself: it must not reach logs.
				return nil, fmt.Errorf("password: a %% is not followed by two hex digits: %s", escapeHint)
			}
			user = url.UserPassword(u, p)
		} else {
			user = url.User(u)
		}
		host = host[at+1:]
	}
	if hasPath {
		p, err := url.PathUnescape("/" + path)
		if err != nil {
			return nil, fmt.Errorf("path %q: %v: %s", "/"+path, err, escapeHint)
		}
		path = p
	}
	return &url.URL{Scheme: scheme, User: user, Host: host, Path: path, RawQuery: query}, nil
}

// checkURLParts checks what every scheme's parser takes for granted: that
// the query is well formed (url.URL.Query drops bad pairs silently), and
// that each comma-separated server in the authority is a host name or an
// IP address, with an optional port the scheme's parser checks. A host
// that no client can dial (a stray %, a space, an IPv6 zone) is a usage
// error here rather than a connection that fails at run time. It returns
// the hosts, for tests.
func checkURLParts(u *url.URL, form string) ([]string, error) {
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return nil, fmt.Errorf("query %q: %v: %s (%s)", u.RawQuery, err, escapeHint, form)
	}
	if u.Host == "" {
		return nil, nil
	}
	var hosts []string
	for _, ep := range strings.Split(u.Host, ",") {
		host := ep
		switch {
		case strings.HasPrefix(ep, "["):
			end := strings.IndexByte(ep, ']')
			if end < 0 {
				return nil, fmt.Errorf("server %q: an IPv6 address in [ has no closing ]: use %s", ep, form)
			}
			host = ep[1:end]
			if rest := ep[end+1:]; rest != "" && !strings.HasPrefix(rest, ":") {
				return nil, fmt.Errorf("server %q: after ] comes :PORT or nothing: use %s", ep, form)
			}
		case strings.Count(ep, ":") == 1:
			host, _, _ = strings.Cut(ep, ":")
		}
		if host == "" {
			continue // the scheme's parser names the missing host
		}
		if err := CheckHost(host); err != nil {
			return nil, fmt.Errorf("server %q: %v: use %s", ep, err, form)
		}
		hosts = append(hosts, host)
	}
	return hosts, nil
}

// CheckHost returns why host is neither an IP address without a zone nor a
// DNS name in ASCII, or nil: what a server in a backend URL must be.
func CheckHost(host string) error {
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return fmt.Errorf("IPv6 zone %%%s: addresses with a zone are not supported; use a global or unique-local address, or a host name", ip.Zone())
		}
		return nil
	}
	if strings.Contains(host, ":") {
		return fmt.Errorf("%q is not an IPv6 address", host)
	}
	for _, r := range host {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
		case r > 0x7f:
			return fmt.Errorf("host %q is not ASCII: write an international domain name in its xn-- (punycode) form", host)
		default:
			return fmt.Errorf("host %q contains %q: a host is a name of letters, digits, '-', '.' and '_', or an IP address", host, r)
		}
	}
	return nil
}

// hostPorts checks a comma-separated host[:port] list and fills in the
// default port.
func hostPorts(list, defaultPort, form string) ([]string, error) {
	var out []string
	for _, ep := range strings.Split(list, ",") {
		host, port := ep, defaultPort
		if h, p, err := net.SplitHostPort(ep); err == nil {
			host, port = h, p
		} else if strings.Count(ep, ":") == 1 || strings.HasPrefix(ep, "[") {
			return nil, fmt.Errorf("server %q is not host:port (%v): use %s", ep, err, form)
		}
		if host == "" {
			return nil, fmt.Errorf("server %q has no host: use %s", ep, form)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("server %q: port %q is not a number from 1 to 65535: use %s", ep, port, form)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	return out, nil
}

// firstKey returns the first of q's keys in sorted order, for a message.
func firstKey(q url.Values) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys[0]
}
