package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/batonhq/baton/cmd/baton/internal/backendurl"
	"github.com/batonhq/baton/internal/agentsock"
)

// The agent's files: `baton agent` serves the calls that carry credentials
// on a Unix socket (package agentsock), and writes the bearer token those
// calls need to a file only its user can read, beside the socket; local
// clients (agent:// backends, curl --unix-socket) find both there. The
// default names depend on the agent's HTTP address, host and port
// (agent-127.0.0.1-8790.sock and .token), so that a client finds them from
// the agent:// URL alone, and two agents on one port of two addresses
// (127.0.0.1:P and 127.0.0.2:P) each have their own.

// agentFileStem is the default name, without extension, of the socket and
// token file of an agent whose HTTP API listens on host:port: the host as
// an address (localhost is 127.0.0.1).
func agentFileStem(host, port string) string {
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	return "agent-" + host + "-" + port
}

// agentDir returns the directory of the agent's default files:
// $XDG_RUNTIME_DIR/baton, /run/baton for root, or baton/ in the user's
// cache directory ($XDG_CACHE_HOME, or ~/.cache).
func agentDir(lookupEnv func(string) (string, bool)) (string, error) {
	if d, ok := lookupEnv("XDG_RUNTIME_DIR"); ok && d != "" {
		return filepath.Join(d, "baton"), nil
	}
	if os.Geteuid() == 0 {
		return "/run/baton", nil
	}
	if d, ok := lookupEnv("XDG_CACHE_HOME"); ok && filepath.IsAbs(d) {
		return filepath.Join(d, "baton"), nil
	}
	if home, ok := lookupEnv("HOME"); ok && home != "" {
		return filepath.Join(home, ".cache", "baton"), nil
	}
	return "", errors.New("no place for the agent's socket and token file: neither XDG_RUNTIME_DIR nor HOME is set; give them with --socket and --http-token-file (BATON_SOCKET, BATON_HTTP_TOKEN_FILE)")
}

// defaultAgentSocket returns DIR/agent-HOST-PORT.sock (see agentDir).
func defaultAgentSocket(lookupEnv func(string) (string, bool), host, port string) (string, error) {
	dir, err := agentDir(lookupEnv)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, agentFileStem(host, port)+".sock"), nil
}

// agentTokenFileOf returns the token file that goes with the agent's
// socket: its path with .token in place of .sock.
func agentTokenFileOf(socket string) string {
	return strings.TrimSuffix(socket, ".sock") + ".token"
}

// agentSocketFor returns the socket of the agent this host runs at
// host:port, for agent://HOST:PORT: the default socket of that address,
// or, for a loopback host, of an agent listening on every address
// (0.0.0.0 or ::), whichever exists and is served; false when neither
// is (the path returned is then the address's own).
func agentSocketFor(lookupEnv func(string) (string, bool), host, port string) (string, bool, error) {
	first, err := defaultAgentSocket(lookupEnv, host, port)
	if err != nil {
		return "", false, err
	}
	cands := []string{first}
	if backendurl.IsLoopback(host) {
		for _, any := range []string{"0.0.0.0", "::"} {
			p, _ := defaultAgentSocket(lookupEnv, any, port)
			cands = append(cands, p)
		}
	}
	for _, p := range cands {
		// A socket nobody serves was left by an agent killed at this
		// address; what answers there now (a `baton run --http`, a new
		// agent listening elsewhere) is not behind it.
		if st, err := os.Lstat(p); err == nil && st.Mode()&fs.ModeSocket != 0 && !agentsock.Stale(p) {
			return p, true, nil
		}
	}
	return first, false, nil
}

// newAgentToken returns a random token: 32 bytes, hexadecimal.
func newAgentToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux since Go 1.24
	return hex.EncodeToString(b[:])
}

// writeAgentToken writes token to path with mode 0600, replacing the file
// atomically, creates its directory with mode 0755 if it is missing, and
// returns the file written (for removing it later only if it is still the
// same). It
// refuses a directory that other users may write to, where one of them
// could swap the file for their own.
func writeAgentToken(path, token string) (fs.FileInfo, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("token file directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("token file directory: %w", err)
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		// Resolved once, here: a link swapped later cannot redirect the
		// file, whose path is built from the resolved directory.
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return nil, fmt.Errorf("token file directory: %w", err)
		}
		if st, err = os.Lstat(dir); err != nil {
			return nil, fmt.Errorf("token file directory: %w", err)
		}
		path = filepath.Join(dir, filepath.Base(path))
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() && st.Mode()&fs.ModeSticky == 0 {
		return nil, fmt.Errorf("token file directory %s belongs to user %d, who could swap the file: use a directory of this user's (uid %d)", dir, sys.Uid, os.Geteuid())
	}
	if st.Mode().Perm()&0o022 != 0 && st.Mode()&fs.ModeSticky == 0 {
		return nil, fmt.Errorf("token file directory %s is writable by other users (mode %s): use a directory only this user can write to", dir, st.Mode().Perm())
	}
	f, err := os.CreateTemp(dir, ".agent-token-*") // mode 0600
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	_, werr := f.WriteString(token + "\n")
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp)
		return nil, err
	}
	written, err := os.Lstat(tmp)
	if err != nil {
		_ = os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return nil, err
	}
	return written, nil
}

// readAgentToken reads the token in path; a missing file gives an error
// wrapping fs.ErrNotExist.
func readAgentToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}
