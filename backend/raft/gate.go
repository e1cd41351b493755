package raft

import (
	"errors"
	"net"
	"sync"
)

// gate cuts a member off the network while the rest of the process goes
// on, as a partition would; in-package tests use it (NodeOptions.gate).
// While cut it refuses connections both ways and has closed the open ones.
// A nil *gate lets everything through.
type gate struct {
	mu    sync.Mutex
	cut   bool
	conns map[*gatedConn]struct{}
	peak  int // the most connections open at once
}

// peakConns returns the most connections that were open at once.
func (g *gate) peakConns() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak
}

var errCut = errors.New("raft: cut off (test partition)")

func (g *gate) track(c net.Conn) (net.Conn, error) {
	if g == nil {
		return c, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut {
		c.Close()
		return nil, errCut
	}
	if g.conns == nil {
		g.conns = map[*gatedConn]struct{}{}
	}
	gc := &gatedConn{Conn: c, g: g}
	g.conns[gc] = struct{}{}
	g.peak = max(g.peak, len(g.conns))
	return gc, nil
}

func (g *gate) set(cut bool) {
	g.mu.Lock()
	g.cut = cut
	var open []*gatedConn
	if cut {
		for c := range g.conns {
			open = append(open, c)
		}
	}
	g.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

type gatedConn struct {
	net.Conn
	g *gate
}

func (c *gatedConn) Close() error {
	c.g.mu.Lock()
	delete(c.g.conns, c)
	c.g.mu.Unlock()
	return c.Conn.Close()
}
