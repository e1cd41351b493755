package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// The agent's token file: `baton agent` writes the bearer token that its
// mutating calls need to a file only its user can read, and local clients
// (agent:// backends, curl) read it from there. The default place depends
// only on the agent's HTTP port, so that a client finds it from the
// agent:// URL alone.

// agentTokenFileName is the default token file's name for an agent whose
// HTTP API listens on port.
func agentTokenFileName(port string) string { return "agent-" + port + ".token" }

// defaultAgentTokenFile returns DIR/agent-PORT.token, where DIR is
// $XDG_RUNTIME_DIR/baton, /run/baton for root, or baton/ in the user's cache
// directory ($XDG_CACHE_HOME, or ~/.cache).
func defaultAgentTokenFile(lookupEnv func(string) (string, bool), port string) (string, error) {
	if d, ok := lookupEnv("XDG_RUNTIME_DIR"); ok && d != "" {
		return filepath.Join(d, "baton", agentTokenFileName(port)), nil
	}
	if os.Geteuid() == 0 {
		return filepath.Join("/run/baton", agentTokenFileName(port)), nil
	}
	cache := ""
	if d, ok := lookupEnv("XDG_CACHE_HOME"); ok && filepath.IsAbs(d) {
		cache = d
	} else if home, ok := lookupEnv("HOME"); ok && home != "" {
		cache = filepath.Join(home, ".cache")
	} else {
		return "", errors.New("no place for the agent's token file: neither XDG_RUNTIME_DIR nor HOME is set; give one with --http-token-file (BATON_HTTP_TOKEN_FILE)")
	}
	return filepath.Join(cache, "baton", agentTokenFileName(port)), nil
}

// newAgentToken returns a random token: 32 bytes, hexadecimal.
func newAgentToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux since Go 1.24
	return hex.EncodeToString(b[:])
}

// writeAgentToken writes token to path with mode 0600, replacing the file
// atomically, and creates its directory with mode 0700 if it is missing. It
// refuses a directory that other users may write to, where one of them
// could swap the file for their own.
func writeAgentToken(path, token string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("token file directory: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("token file directory: %w", err)
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		// Resolved once, here: a link swapped later cannot redirect the
		// file, whose path is built from the resolved directory.
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return fmt.Errorf("token file directory: %w", err)
		}
		if st, err = os.Lstat(dir); err != nil {
			return fmt.Errorf("token file directory: %w", err)
		}
		path = filepath.Join(dir, filepath.Base(path))
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() && st.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("token file directory %s belongs to user %d, who could swap the file: use a directory of this user's (uid %d)", dir, sys.Uid, os.Geteuid())
	}
	if st.Mode().Perm()&0o022 != 0 && st.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("token file directory %s is writable by other users (mode %s): use a directory only this user can write to", dir, st.Mode().Perm())
	}
	f, err := os.CreateTemp(dir, ".agent-token-*") // mode 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.WriteString(token + "\n")
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
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
