package raft

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testkit"
)

// fixedPeers is a Discoverer that returns the same addresses every time.
type fixedPeers []string

func (p fixedPeers) Peers(context.Context) ([]string, error) { return p, nil }

// An impostor without the secret that answers every proof with "refused,
// by a member of a live group" sits at one of the three addresses a new
// member in the secret-only mode finds (a machine in the middle, or one
// that took a peer's address; it needs no certificate of anyone's); the
// other two are not up yet. One such answer must not end the member: a
// member gives up on a refusal of its secret only when a majority of the
// peers it finds refuse it, so an impostor at one address cannot make it
// exit (exit 2, which its service manager does not restart).
func TestOneImpostorCannotEndAMember(t *testing.T) {
	t.Parallel()
	cfg, err := selfSignedTLS("impostor")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var refusals atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(c, make([]byte, 1+proofLen)); err != nil {
					return
				}
				_, _ = c.Write([]byte{authRefusedInGroup})
				refusals.Add(1)
			}()
		}
	}()
	closed := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		return addr
	}
	n := startOutsider(t, NodeOptions{
		BindAddr:        "127.0.0.1:0",
		Secret:          testSecret,
		Discovery:       fixedPeers{ln.Addr().String(), closed(), closed()},
		BootstrapExpect: 3,
		Logger:          testLogger(t),
	})
	// Each round of joining asks every peer once, one round after
	// another: past refusedRoundsToFail+2 refusals, the rounds that could
	// have ended the member are over.
	want := int64(refusedRoundsToFail + 2)
	testkit.Eventually(t, 60*time.Second, "the impostor refusing the member's proof several rounds over, or the member giving up", func() bool {
		select {
		case <-n.Failed():
			return true
		default:
		}
		return refusals.Load() >= want
	})
	if err := n.Err(); err != nil {
		t.Fatalf("one impostor at one of three addresses ended the member: %v", err)
	}
}
