package raft

import (
	"context"
	"crypto/tls"
	"errors"
	"slices"
	"time"
)

// Reloader gives a running member its credentials again, so that a
// rotation of the secret or of the certificates needs no restart: files
// re-read, a secret store asked again (the CLI's --secret-file and
// --secret-from, and its --tls-* files, are one).
type Reloader interface {
	// Reload returns the secrets the member holds from now on, the first
	// the one it proves first (as NodeOptions.Secret and PreviousSecrets),
	// and, in CA mode, a new TLS configuration, or nil to keep the one in
	// use (return one only when it changed). On an error the member keeps
	// what it has, logs it and asks again at the next tick.
	Reload(ctx context.Context) (secrets []string, cfg *tls.Config, err error)
}

// DefaultReloadEvery is NodeOptions.ReloadEvery when it is zero.
const DefaultReloadEvery = 30 * time.Second

// reload asks opts.Reloader for the member's credentials every
// ReloadEvery until the member stops, and applies what changed.
func (n *Node) reload() {
	defer n.wg.Done()
	t := time.NewTicker(n.opts.ReloadEvery)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(n.ctx, max(n.opts.ReloadEvery, 10*time.Second))
		secrets, cfg, err := n.opts.Reloader.Reload(ctx)
		cancel()
		if err == nil && len(secrets) == 0 {
			err = errNoSecrets
		}
		if err == nil && cfg != nil {
			err = n.SetTLS(cfg)
			if err == nil {
				n.log.Info("TLS certificates reloaded")
			}
		}
		// Compared as the member holds them, each once: a value that names
		// a secret twice changes nothing.
		if err == nil {
			if held := secretList(secrets[0], secrets[1:]); !slices.Equal(held, n.secretsHeld()) {
				if err = n.SetSecrets(secrets[0], secrets[1:]...); err == nil {
					n.log.Info("the group's secrets changed", "held", len(held))
				}
			}
		}
		switch {
		case err != nil && n.ctx.Err() == nil:
			// Once per run of failures: the member goes on with what it
			// holds, and a store that is down for an hour is one line.
			if !failing {
				n.log.Warn("could not reload the secret or the TLS files; keeping those in use and retrying", "every", n.opts.ReloadEvery, "err", err)
			}
			failing = true
		case err == nil && failing:
			n.log.Info("reloading the secret and the TLS files works again")
			failing = false
		}
	}
}

// errNoSecrets is a Reloader's answer without a secret.
var errNoSecrets = errors.New("raft: the reload returned no secret")

// secretsHeld returns the secrets the member holds, the one it proves
// first first.
func (n *Node) secretsHeld() []string {
	n.secretsMu.Lock()
	defer n.secretsMu.Unlock()
	return slices.Clone(n.secrets)
}
