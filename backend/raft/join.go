package raft

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"
)

// MinSecretLen is the shortest join secret a member accepts, in bytes.
const MinSecretLen = 16

// ReadSecretFile reads a group's secrets from path, as ParseSecrets
// reads them: the secret to prove, and the others accepted during a
// rotation.
func ReadSecretFile(path string) (secret string, previous []string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	secret, previous, err = ParseSecrets(string(b))
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", path, err)
	}
	return secret, previous, nil
}

// ParseSecrets reads a group's secrets from text (a file, a variable, a
// parameter's value): one secret per line, white space around each line
// ignored, blank lines skipped, and a UTF-8 byte order mark at the start
// (which some editors write) dropped. The first is the secret the member proves
// (NodeOptions.Secret); the others, during a rotation, are accepted too
// (NodeOptions.PreviousSecrets). Each must be at least MinSecretLen bytes.
func ParseSecrets(text string) (secret string, previous []string, err error) {
	var all []string
	for line := range strings.Lines(strings.TrimPrefix(text, "\ufeff")) {
		if s := strings.TrimSpace(line); s != "" {
			all = append(all, s)
		}
	}
	if len(all) == 0 {
		return "", nil, fmt.Errorf("no secret in it: the join secret must be at least %d bytes (e.g. from `openssl rand -hex 32`)", MinSecretLen)
	}
	for i, s := range all {
		if len(s) < MinSecretLen {
			which := "the secret"
			if len(all) > 1 {
				which = fmt.Sprintf("secret %d of %d (one per line)", i+1, len(all))
			}
			return "", nil, fmt.Errorf("%s is %d bytes: each join secret must be at least %d", which, len(s), MinSecretLen)
		}
	}
	return all[0], all[1:], nil
}

// AdvertiseFor returns the address peers reach a member bound to bind at:
// bind itself, or, when bind's host is an unspecified address (0.0.0.0,
// ::), this host's first private IPv4 address (PrivateIPv4) with bind's
// port. It returns "" for a bind whose host is a name: NodeOptions then
// advertise the address the member listens on.
func AdvertiseFor(bind string) (string, error) {
	host, port, err := net.SplitHostPort(bind)
	if err != nil {
		return "", err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || !ip.IsUnspecified() {
		return "", nil
	}
	priv, err := PrivateIPv4()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(priv.String(), port), nil
}

// PrivateIPv4 returns this host's first private (RFC 1918) IPv4 address.
func PrivateIPv4() (netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err == nil && p.Addr().Is4() && p.Addr().IsPrivate() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, errors.New("this host has no private IPv4 address")
}

// joinWarnEvery is how often StartMember repeats that the member is not in
// a group yet.
const joinWarnEvery = 10 * time.Second

// StartMember starts a member with opts (StartNode) and waits until it is
// in a group, logging on opts.Logger while it waits. A member refused by a
// live group for its secret is closed, and the error wraps
// ErrSecretRefused; one whose certificate a majority of its peers refuse
// (another CA's), ErrCertificateRefused: retrying cannot help. When ctx ends first, the member
// is closed (within closeTimeout) and ctx's error returned.
func StartMember(ctx context.Context, opts NodeOptions, closeTimeout time.Duration) (*Node, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n, err := StartNode(opts)
	if err != nil {
		return nil, err
	}
	log.Info("raft member started; finding the group", "id", n.ID(), "addr", n.Addr(), "bootstrap_expect", opts.BootstrapExpect)
	closeMember := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = n.Close(cctx)
	}
	tick := time.NewTicker(joinWarnEvery)
	defer tick.Stop()
	for {
		select {
		case <-n.Joined():
			st := n.Status()
			log.Info("in the group", "leader", st.Leader, "members", len(st.Members), "voters", len(st.Voters))
			return n, nil
		case <-n.Failed():
			closeMember()
			return nil, n.Err()
		case <-tick.C:
			if err := n.lastJoinErr(); errors.Is(err, errLeaderless) {
				// The configuration is right: the group it found has no
				// raft leader.
				log.Warn("still not in a group: the members found hold a log but have no raft leader; the group may have lost its quorum (its members say why at ERROR, and how it recovers); joining once it has a leader", "id", n.ID())
				continue
			}
			log.Warn("still not in a group: check where peers are found (--join, NodeOptions.Discovery), the TLS files and the secret on every member", "id", n.ID())
		case <-ctx.Done():
			closeMember()
			return nil, ctx.Err()
		}
	}
}
