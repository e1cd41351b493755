package testserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/batonhq/baton/internal/certs"
)

// consulStateFile is the file, in the directory of a Persist server, that
// keeps what a restart must reuse: the ports and the ACL token.
const consulStateFile = "consul-state.json"

// consulState is what a Persist server's restart must reuse, kept in
// consulStateFile.
type consulState struct {
	HTTP    int    `json:"http"` // the HTTP, or with TLS the HTTPS, port
	SerfLAN int    `json:"serf_lan"`
	SerfWAN int    `json:"serf_wan"`
	Server  int    `json:"server"`
	Token   string `json:"token,omitempty"`
}

// loadConsulState returns the state a Persist server saved in dir, or nil
// if none did.
func loadConsulState(dir string) (*consulState, error) {
	path := filepath.Join(dir, consulStateFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consul: read the saved ports: %w", err)
	}
	var st consulState
	if err := json.Unmarshal(b, &st); err != nil || st.HTTP == 0 || st.SerfLAN == 0 || st.SerfWAN == 0 || st.Server == 0 {
		return nil, fmt.Errorf("consul: %s is damaged (%v): remove %s to start a fresh server there", path, err, dir)
	}
	return &st, nil
}

// saveConsulState saves st in dir, atomically, for restarts.
func saveConsulState(dir string, st *consulState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, consulStateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("consul: save the ports: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, consulStateFile)); err != nil {
		return fmt.Errorf("consul: save the ports: %w", err)
	}
	return nil
}

// checkFree returns an error naming the first of the saved ports that is
// taken on 127.0.0.1: TCP for all, UDP too for the serf ports.
func (st *consulState) checkFree(dir string) error {
	for _, p := range []struct {
		name   string
		port   int
		udpToo bool
	}{{"http", st.HTTP, false}, {"serf_lan", st.SerfLAN, true}, {"serf_wan", st.SerfWAN, true}, {"server", st.Server, false}} {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			ln.Close()
			if p.udpToo {
				var pc net.PacketConn
				pc, err = net.ListenPacket("udp", addr)
				if err == nil {
					pc.Close()
				}
			}
		}
		if err != nil {
			return fmt.Errorf("consul: the server in %s must restart on the ports its data remembers, "+
				"but its %s port %s is taken (%v): stop whatever holds it (another consul on the same dir?), "+
				"or start on a fresh dir", dir, p.name, addr, err)
		}
	}
	return nil
}

// tlsMaterial makes a CA, a server certificate for 127.0.0.1 and a client
// certificate, writes them into dir, and returns the agent's tls stanza.
// With reuse, the files a previous start wrote there are used instead, so
// that clients of a restarted server keep trusting it.
func (c *Consul) tlsMaterial(dir string, reuse bool) (string, error) {
	c.caFile = filepath.Join(dir, "ca.pem")
	c.cert = filepath.Join(dir, "client.pem")
	c.key = filepath.Join(dir, "client-key.pem")
	srvCertFile, srvKeyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	stanza := fmt.Sprintf(`tls {
	https {
		ca_file = %q
		cert_file = %q
		key_file = %q
		verify_incoming = true
	}
}`, c.caFile, srvCertFile, srvKeyFile)
	if reuse {
		for _, f := range []string{c.caFile, c.cert, c.key, srvCertFile, srvKeyFile} {
			if _, err := os.Stat(f); err != nil {
				return "", fmt.Errorf("consul: restart with TLS: %w", err)
			}
		}
		return stanza, nil
	}
	ca, err := certs.NewCA("baton test consul CA", time.Hour)
	if err != nil {
		return "", err
	}
	srvCert, srvKey, err := ca.Issue("server.dc1.consul", []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		return "", err
	}
	cliCert, cliKey, err := ca.Issue("baton-client", nil, time.Hour)
	if err != nil {
		return "", err
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{c.caFile, ca.CertPEM(), 0o644},
		{srvCertFile, srvCert, 0o644},
		{srvKeyFile, srvKey, 0o600},
		{c.cert, cliCert, 0o644},
		{c.key, cliKey, 0o600},
	} {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return "", err
		}
	}
	return stanza, nil
}
