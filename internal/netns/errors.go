//go:build linux

package netns

import "errors"

var (
	// ErrUnavailable is wrapped by the errors of Available and Open when
	// this process cannot build namespaced networks: not root, `ip` or
	// `nft` missing, or a kernel without the features a Net uses.
	ErrUnavailable = errors.New("netns: network namespaces unavailable")

	// ErrClosed is returned by the methods of a Net after Close.
	ErrClosed = errors.New("netns: network closed")

	// ErrUnknownHost is returned when a Host passed to a Net is not one of
	// its current hosts: it belongs to another Net, or was removed.
	ErrUnknownHost = errors.New("netns: host not in this network")

	// ErrFull is returned by AddHost when every address of the Net's subnet
	// has been handed out. Addresses are never reused, so a Net can create
	// at most MaxHosts hosts over its life, removed ones included.
	ErrFull = errors.New("netns: no address left in the subnet")
)
