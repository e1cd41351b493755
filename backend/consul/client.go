package consul

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

// ClientConfig says how to reach a Consul agent's HTTP API. Empty fields
// fall back to Consul's own environment variables, which the consul CLI
// reads too (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE,
// CONSUL_HTTP_SSL, CONSUL_CACERT, CONSUL_CAPATH, CONSUL_CLIENT_CERT,
// CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME, CONSUL_HTTP_SSL_VERIFY), and
// then to the local agent, http://127.0.0.1:8500, without a token. The
// zero value is ready to use. It is a plain value, safe to copy.
type ClientConfig struct {
	// Address is the agent's address: "host:port" (HTTP, or HTTPS when TLS
	// is set or implied), "http://host:port", "https://host:port", or
	// "unix:///path/to/socket".
	Address string

	// Token is the ACL token sent with every request. It needs
	// session:write on the agent's node and key:write on the Backend's
	// prefix (see the package doc). Prefer TokenFile or CONSUL_HTTP_TOKEN
	// to keep it out of command lines.
	Token string

	// TokenFile is a file holding the ACL token; it takes precedence over
	// Token.
	TokenFile string

	// Datacenter is the datacenter to use; empty means the agent's.
	Datacenter string

	// TLS makes the client speak HTTPS. It is implied by an "https://"
	// Address and by any of the TLS files below.
	TLS bool

	// CAFile and CAPath name the CA certificates that the agent's
	// certificate must chain to; empty means the system roots.
	CAFile, CAPath string

	// CertFile and KeyFile are the client certificate and key, for agents
	// that verify incoming HTTPS connections.
	CertFile, KeyFile string

	// TLSServerName is the name the agent's certificate must carry, when it
	// differs from the host in Address.
	TLSServerName string

	// InsecureSkipVerify turns off the verification of the agent's
	// certificate. For experiments only: anyone on the path can then pose
	// as the agent and, for instance, grant every lock.
	InsecureSkipVerify bool

	// Compress asks the agent to gzip its answers. Off by default: the
	// agent then spends more CPU compressing a Backend's largest answers,
	// its watch's lists of keys, than producing them, while between a
	// process and its host's agent, or on a LAN, the bytes saved matter
	// little. Turn it on when the process reaches the servers' HTTP API
	// over a slow or metered link (as without client agents), where a
	// list of thousands of keys is some hundreds of kilobytes plain and a
	// twentieth of that compressed.
	Compress bool
}

// NewClient returns an API client for cc. The client holds nothing that
// needs closing; pass it to New.
func NewClient(cc ClientConfig) (*api.Client, error) {
	cfg := api.DefaultConfig() // Consul's environment variables
	if cc.Address != "" {
		cfg.Address = cc.Address
	}
	if cc.Token != "" {
		cfg.Token = cc.Token
	}
	if cc.TokenFile != "" {
		cfg.TokenFile = cc.TokenFile
	}
	if cc.Datacenter != "" {
		cfg.Datacenter = cc.Datacenter
	}
	tc := &cfg.TLSConfig
	for _, f := range []struct {
		dst *string
		v   string
	}{
		{&tc.CAFile, cc.CAFile}, {&tc.CAPath, cc.CAPath},
		{&tc.CertFile, cc.CertFile}, {&tc.KeyFile, cc.KeyFile},
		{&tc.Address, cc.TLSServerName},
	} {
		if f.v != "" {
			*f.dst = f.v
		}
	}
	if cc.InsecureSkipVerify {
		tc.InsecureSkipVerify = true
	}
	if cc.TLS || cc.CAFile != "" || cc.CAPath != "" || cc.CertFile != "" || cc.KeyFile != "" {
		if strings.HasPrefix(cfg.Address, "http://") {
			return nil, fmt.Errorf("consul: address %q says http, but TLS settings are given: use https:// or host:port", cfg.Address)
		}
		cfg.Scheme = "https"
	}
	if (tc.CertFile == "") != (tc.KeyFile == "") {
		return nil, fmt.Errorf("consul: a client certificate needs both a certificate file (%q) and a key file (%q)", tc.CertFile, tc.KeyFile)
	}
	// The pooled transport keeps GOMAXPROCS+1 idle connections per host; a
	// Backend has up to DefaultMaxRequests requests and maxWatchQueries
	// blocking queries in flight, and with a smaller pool every burst
	// would open and close connections. The transport's TLS settings are
	// applied by api.NewClient from cfg.TLSConfig.
	cfg.Transport.MaxIdleConnsPerHost = DefaultMaxRequests + maxWatchQueries
	// Go's client asks for gzip unless told not to, and the agent then
	// compresses every answer: for a watch's list of 3,000 keys that is
	// half again the agent's CPU of producing it (see Compress).
	cfg.Transport.DisableCompression = !cc.Compress
	client, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul: %w", err)
	}
	return client, nil
}

// ParseURL maps a backend URL of the baton CLI to a ClientConfig and the
// Options' Prefix:
//
//	consul://HOST:PORT/PREFIX?tls=true&ca-file=F&cert-file=F&key-file=F&tls-server-name=N&token-file=F&dc=DC&compress=true
//
// The path, if any, is the Prefix, with a trailing "/" added: the lease
// NAME of consul://127.0.0.1:8500/service/ is held at
// service/NAME/.lock, where `consul lock service/NAME` contends for it.
// No path means DefaultPrefix. An empty host means Consul's environment
// (CONSUL_HTTP_ADDR), then 127.0.0.1:8500. A "token" parameter is refused:
// URLs end up in process lists and logs, so give the token through
// token-file or CONSUL_HTTP_TOKEN.
func ParseURL(raw string) (ClientConfig, Options, error) {
	var (
		cc   ClientConfig
		opts Options
	)
	u, err := url.Parse(raw)
	if err != nil {
		return cc, opts, fmt.Errorf("consul: backend URL: %w", err)
	}
	if u.Scheme != "consul" {
		return cc, opts, fmt.Errorf("consul: backend URL %q: scheme must be consul://", raw)
	}
	if u.User != nil {
		return cc, opts, fmt.Errorf("consul: backend URL %q: user information is not supported; give an ACL token through token-file or CONSUL_HTTP_TOKEN", raw)
	}
	cc.Address = u.Host
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		opts.Prefix = strings.TrimSuffix(p, "/") + "/"
	}
	var problems []string
	q := u.Query()
	for _, k := range slices.Sorted(maps.Keys(q)) {
		v := q.Get(k)
		switch k {
		case "tls":
			b, err := strconv.ParseBool(v)
			if err != nil {
				problems = append(problems, fmt.Sprintf("tls=%q is not a boolean", v))
			}
			cc.TLS = b
		case "ca-file":
			cc.CAFile = v
		case "ca-path":
			cc.CAPath = v
		case "cert-file":
			cc.CertFile = v
		case "key-file":
			cc.KeyFile = v
		case "tls-server-name":
			cc.TLSServerName = v
		case "token-file":
			cc.TokenFile = v
		case "dc":
			cc.Datacenter = v
		case "compress":
			b, err := strconv.ParseBool(v)
			if err != nil {
				problems = append(problems, fmt.Sprintf("compress=%q is not a boolean", v))
			}
			cc.Compress = b
		case "token":
			problems = append(problems, "the token parameter is refused, as URLs show in process lists and logs: use token-file or CONSUL_HTTP_TOKEN")
		default:
			problems = append(problems, fmt.Sprintf("unknown parameter %q (known: tls, ca-file, ca-path, cert-file, key-file, tls-server-name, token-file, dc, compress)", k))
		}
	}
	if len(problems) > 0 {
		return cc, opts, fmt.Errorf("consul: backend URL %q: %s", raw, strings.Join(problems, "; "))
	}
	return cc, opts, nil
}
