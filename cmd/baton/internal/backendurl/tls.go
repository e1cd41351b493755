package backendurl

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"strconv"
)

// The TLS query parameters of zk:// URLs, named after the consul CLI's
// flags as consul.ParseURL's are.

// tlsParams are the query parameters that turn on TLS to a ZooKeeper
// ensemble: ca-file=FILE (the CA that signed the servers' certificates; the
// system's roots when absent), cert-file=FILE and key-file=FILE (a client
// certificate, when the servers ask for one), tls-server-name=NAME (the
// name to verify in the server's certificate, when it is not the host in
// the URL) and tls=1 (TLS with the system's roots and nothing else).
type tlsParams struct {
	enabled                bool
	ca, cert, key, srvName string
}

// parseTLSParams takes the TLS parameters out of q, leaving the rest, and
// reports bad ones the way the URL parsers do.
func parseTLSParams(q url.Values, form string) (tlsParams, error) {
	var p tlsParams
	take := func(name string) (string, error) {
		v := q[name]
		delete(q, name)
		switch {
		case len(v) > 1:
			return "", fmt.Errorf("query parameter %s is given %d times: give it once (%s)", name, len(v), form)
		case len(v) == 1 && v[0] == "":
			return "", fmt.Errorf("query parameter %s is empty: give a file or drop it (%s)", name, form)
		case len(v) == 1:
			return v[0], nil
		}
		return "", nil
	}
	var err error
	var on string
	if on, err = take("tls"); err != nil {
		return p, err
	}
	if on != "" {
		b, perr := strconv.ParseBool(on)
		if perr != nil {
			return p, fmt.Errorf("query parameter tls=%q: use tls=1 or tls=0", on)
		}
		p.enabled = b
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"ca-file", &p.ca}, {"cert-file", &p.cert}, {"key-file", &p.key}, {"tls-server-name", &p.srvName}} {
		if *f.dst, err = take(f.name); err != nil {
			return p, err
		}
		if *f.dst != "" {
			p.enabled = true
		}
	}
	if (p.cert == "") != (p.key == "") {
		return p, fmt.Errorf("cert-file and key-file go together: give both files of the client certificate, or neither (%s)", form)
	}
	return p, nil
}

// config reads the files and returns the TLS configuration, or nil when TLS
// is off. A bad file is a usage error naming it.
func (p tlsParams) config() (*tls.Config, error) {
	if !p.enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: p.srvName}
	if p.ca != "" {
		pem, err := os.ReadFile(p.ca)
		if err != nil {
			return nil, settingsErrorf("zk URL ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, settingsErrorf("zk URL ca-file %s holds no PEM certificate: give the CA certificate that signed the servers' certificates", p.ca)
		}
		cfg.RootCAs = pool
	}
	if p.cert != "" {
		pair, err := tls.LoadX509KeyPair(p.cert, p.key)
		if err != nil {
			return nil, settingsErrorf("zk URL cert-file %s / key-file %s: %v", p.cert, p.key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
