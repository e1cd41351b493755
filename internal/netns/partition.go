//go:build linux

package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Partition splits the Net into groups: hosts in different groups can no
// longer exchange packets, hosts in the same group still can. Every current
// host must be in exactly one group; a group may be empty. It replaces any
// previous partition. See the package doc for how packets are dropped and
// why the change is not atomic across hosts.
//
// The hosts are checked first and every problem is reported at once, in
// which case nothing changes. If applying the rules to a host fails, the
// hosts updated before it keep the new rules; call Heal or Partition again.
func (n *Net) Partition(groups ...[]*Host) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	blocked, err := plan(n.hosts, groups)
	if err != nil {
		return err
	}
	for _, h := range n.hosts {
		if err := n.tools.nftScript(h.Name, rulesScript(blocked[h])); err != nil {
			return fmt.Errorf("netns: partition host %s: %w", h.Name, err)
		}
	}
	return nil
}

// Isolate cuts h off from every other host, replacing any previous
// partition. It is Partition with two groups, h and the rest.
func (n *Net) Isolate(h *Host) error {
	n.mu.Lock()
	var rest []*Host
	for _, o := range n.hosts {
		if o != h {
			rest = append(rest, o)
		}
	}
	n.mu.Unlock()
	// A host added or removed before Partition takes the lock makes it fail
	// naming that host, rather than isolate from a stale list.
	return n.Partition([]*Host{h}, rest)
}

// Heal removes the partition rules from every host, so that all can reach
// all again. Healing a Net that is not partitioned does nothing.
func (n *Net) Heal() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	var errs []error
	for _, h := range n.hosts {
		if err := n.tools.nftScript(h.Name, rulesScript(nil)); err != nil {
			errs = append(errs, fmt.Errorf("netns: heal host %s: %w", h.Name, err))
		}
	}
	return errors.Join(errs...)
}

// plan returns, for each host, the addresses it must drop packets to and
// from for the hosts to be split into groups, or every reason why groups is
// not a split of hosts.
func plan(hosts []*Host, groups [][]*Host) (map[*Host][]netip.Addr, error) {
	group := make(map[*Host]int, len(hosts))
	for _, h := range hosts {
		group[h] = -1
	}
	var errs []error
	for gi, g := range groups {
		for _, h := range g {
			prev, ok := group[h]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%v in group %d: %w", h, gi, ErrUnknownHost))
			case prev >= 0 && prev != gi:
				errs = append(errs, fmt.Errorf("host %v is in groups %d and %d", h, prev, gi))
			default:
				group[h] = gi
			}
		}
	}
	for _, h := range hosts {
		if group[h] < 0 {
			errs = append(errs, fmt.Errorf("host %v is in no group", h))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("netns: partition: %w", errors.Join(errs...))
	}
	blocked := make(map[*Host][]netip.Addr, len(hosts))
	for _, h := range hosts {
		for _, o := range hosts {
			if group[o] != group[h] {
				blocked[h] = append(blocked[h], o.IP)
			}
		}
	}
	return blocked, nil
}

// rulesScript returns the nft script that makes a host drop every IPv4
// packet to and from the blocked addresses, and nothing else; with none it
// removes the rules.
//
// The script first adds the table and deletes it, which works whether or not
// it exists, then recreates it whole. nft applies a script as one
// transaction, so the host never runs with half its rules. Dropping on input
// alone would do, since every host applies rules, but a host also dropping
// on output keeps a pair cut while the other side's rules are being
// replaced.
func rulesScript(blocked []netip.Addr) string {
	var b strings.Builder
	b.WriteString("table inet baton\ndelete table inet baton\n")
	if len(blocked) == 0 {
		return b.String()
	}
	elems := make([]string, len(blocked))
	for i, a := range blocked {
		elems[i] = a.String()
	}
	fmt.Fprintf(&b, `table inet baton {
	set blocked {
		type ipv4_addr
		elements = { %s }
	}
	chain input {
		type filter hook input priority 0; policy accept;
		ip saddr @blocked drop
	}
	chain output {
		type filter hook output priority 0; policy accept;
		ip daddr @blocked drop
	}
}
`, strings.Join(elems, ", "))
	return b.String()
}
