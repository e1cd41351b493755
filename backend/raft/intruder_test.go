package raft

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/hashicorp/go-hclog"
	hraft "github.com/hashicorp/raft"
)

// An intruder holds a certificate signed by the group's CA (the key of a
// member's TLS files, or the CA key itself) but not the group's secret. It
// speaks hashicorp/raft's own protocol on the members' port, as a member
// would: heartbeats with ever higher terms, to depose the raft leader and
// keep the group leaderless, and log entries (a session, a lease) to make
// itself a holder. Every such connection must get nothing.

// intruderStream is a hraft.StreamLayer that dials members' raft streams
// with TLS and the group's protocol byte, and nothing else: the intruder
// has no secret to prove. It records the local address of each connection
// it made, which is the peer address the members see.
type intruderStream struct {
	tls  *tls.Config
	addr *net.TCPAddr

	mu     sync.Mutex
	locals []string
	done   chan struct{}
	once   sync.Once
}

func (s *intruderStream) Dial(addr hraft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: timeout}, "tcp", string(addr), s.tls)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.locals = append(s.locals, c.LocalAddr().String())
	s.mu.Unlock()
	if _, err := c.Write([]byte{protoRaft}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Accept blocks: nobody dials the intruder.
func (s *intruderStream) Accept() (net.Conn, error) { <-s.done; return nil, net.ErrClosed }

func (s *intruderStream) Close() error { s.once.Do(func() { close(s.done) }); return nil }

func (s *intruderStream) Addr() net.Addr { return s.addr }

func (s *intruderStream) localAddrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.locals)
}

// attrRecorder is a slog.Handler that keeps every record at Info and above
// with its attributes, so that a test can tell what a member logged about
// whom.
type attrRecorder struct {
	mu   sync.Mutex
	recs []recorded
}

type recorded struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (r *attrRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }

func (r *attrRecorder) Handle(_ context.Context, rec slog.Record) error {
	a := map[string]string{}
	rec.Attrs(func(at slog.Attr) bool { a[at.Key] = at.Value.String(); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, recorded{level: rec.Level, msg: rec.Message, attrs: a})
	return nil
}

func (r *attrRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *attrRecorder) WithGroup(string) slog.Handler      { return r }

// find returns the records at level or above whose attribute key is one of
// vals.
func (r *attrRecorder) find(level slog.Level, key string, vals []string) []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recorded
	for _, rec := range r.recs {
		if rec.level >= level && slices.Contains(vals, rec.attrs[key]) {
			out = append(out, rec)
		}
	}
	return out
}

func (r *attrRecorder) all() []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.recs)
}

// TestRaftStreamNeedsSecret is the attack: a 3-member group, a lease held
// on one member, and an intruder with a CA-signed certificate and no secret
// that, for several seconds, sends every member AppendEntries heartbeats
// and RequestVotes with rising terms, and AppendEntries that overwrite the
// log with a session and an acquire of its own. The group must keep a
// ready raft leader that is one of its members, no member may ever take
// the intruder for its raft leader, the holder keeps its term, the
// intruder's session and lease never appear, and every member logs a
// warning naming the intruder's address.
//
// It runs in both modes: in CA mode the intruder's certificate is of the
// group's CA; in secret-only mode (NodeOptions.TLS nil) it is one of its
// own, which the members accept at the TLS layer as they accept each
// other's.
func TestRaftStreamNeedsSecret(t *testing.T) {
	for _, secretOnly := range []bool{false, true} {
		t.Run(modeName(secretOnly), func(t *testing.T) { testRaftStreamNeedsSecret(t, secretOnly) })
	}
}

// modeName names a test's TLS mode.
func modeName(secretOnly bool) string {
	if secretOnly {
		return "secret-only"
	}
	return "CA"
}

// secretOnlyIf returns an option that puts a member in secret-only mode
// when on is true.
func secretOnlyIf(on bool) func(*NodeOptions) {
	return func(o *NodeOptions) {
		if on {
			o.TLS = nil
		}
	}
}

// outsiderTLS is the TLS configuration of a process that is no member: a
// certificate of g's CA, or in secret-only mode one of its own.
func outsiderTLS(t testing.TB, g *testGroup, secretOnly bool, name string) *tls.Config {
	t.Helper()
	var cfg *tls.Config
	var err error
	if secretOnly {
		cfg, err = selfSignedTLS(name)
	} else {
		cfg, err = g.ca.Config(name, []string{"127.0.0.1"})
	}
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func testRaftStreamNeedsSecret(t *testing.T, secretOnly bool) {
	recs := make([]*attrRecorder, 3)
	g := newMembershipGroup(t, 3, func(i int, o *NodeOptions) {
		recs[i] = &attrRecorder{}
		o.Logger = slog.New(recs[i])
		secretOnlyIf(secretOnly)(o)
		// What the test checks is that the intruder costs the holder
		// nothing, not that a short heartbeat and TTL survive a loaded
		// machine.
		busyHostTiming(o)
	})
	readyLeaderOf(t, g)
	cfg := backend.Config{TTL: DefaultTTL}
	holderNode := g.members()[1]
	b := newBackend(t, holderNode, cfg)
	term := campaignWithin(t, b, "job", "holder", 20*time.Second)

	cliTLS := outsiderTLS(t, g, secretOnly, "intruder")
	lnAddr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}
	stream := &intruderStream{tls: cliTLS, addr: lnAddr, done: make(chan struct{})}
	trans := hraft.NewNetworkTransportWithConfig(&hraft.NetworkTransportConfig{
		Stream: stream, MaxPool: 3, Timeout: 2 * time.Second, Logger: hclog.NewNullLogger(),
	})
	defer trans.Close()
	const intruderID = "intruder"
	header := hraft.RPCHeader{ProtocolVersion: hraft.ProtocolVersionMax, ID: []byte(intruderID), Addr: []byte(lnAddr.String())}

	session := "intruder-session"
	commands := []command{
		{Op: opSessionCreate, Session: session, Node: intruderID, TTL: time.Hour},
		{Op: opAcquire, Session: session, Lease: "L", Candidate: intruderID, Time: time.Now()},
	}

	members := g.members()
	var (
		wg       sync.WaitGroup
		stop     = make(chan struct{})
		accepted sync.Map // member ID -> what it accepted
	)
	for _, m := range members {
		target := hraft.ServerAddress(m.Addr())
		wg.Go(func() {
			var attackTerm, lastLog uint64 = 100, 0
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				attackTerm++
				hb := hraft.AppendEntriesRequest{RPCHeader: header, Term: attackTerm, Leader: []byte(lnAddr.String())}
				var resp hraft.AppendEntriesResponse
				if err := trans.AppendEntries(hraft.ServerID(m.ID()), target, &hb, &resp); err != nil {
					continue
				}
				if resp.Success {
					accepted.Store(m.ID(), fmt.Sprintf("heartbeat at term %d", attackTerm))
				}
				if resp.Term > attackTerm {
					attackTerm = resp.Term
				}
				lastLog = max(lastLog, resp.LastLog)
				if round%5 == 0 {
					// Replace the member's whole log from index 1 with
					// the intruder's term: no-ops up to its last index,
					// then the commands, committed at once.
					var entries []*hraft.Log
					for i := uint64(1); i <= lastLog; i++ {
						entries = append(entries, &hraft.Log{Index: i, Term: attackTerm, Type: hraft.LogNoop})
					}
					for _, c := range commands {
						data, _ := json.Marshal(c)
						entries = append(entries, &hraft.Log{Index: uint64(len(entries)) + 1, Term: attackTerm, Type: hraft.LogCommand, Data: data})
					}
					ae := hraft.AppendEntriesRequest{RPCHeader: header, Term: attackTerm, Leader: []byte(lnAddr.String()),
						Entries: entries, LeaderCommitIndex: uint64(len(entries))}
					var r hraft.AppendEntriesResponse
					if err := trans.AppendEntries(hraft.ServerID(m.ID()), target, &ae, &r); err == nil && r.Success {
						accepted.Store(m.ID(), fmt.Sprintf("%d entries at term %d", len(entries), attackTerm))
					}
				}
				if round%3 == 0 {
					attackTerm++
					rv := hraft.RequestVoteRequest{RPCHeader: header, Term: attackTerm, LastLogIndex: lastLog + 1000, LastLogTerm: attackTerm}
					var r hraft.RequestVoteResponse
					if err := trans.RequestVote(hraft.ServerID(m.ID()), target, &rv, &r); err == nil && r.Granted {
						accepted.Store(m.ID(), fmt.Sprintf("vote at term %d", attackTerm))
					}
				}
			}
		})
	}

	// While the attack goes on (a TTL and a second: several election
	// timeouts, and long enough that a group the intruder kept leaderless
	// would have let the holder's term run out), no member follows the
	// intruder and the holder keeps its term.
	neverWithin(t, cfg.TTL+time.Second, "a member took the intruder's RPCs", func() (bool, string) {
		for _, m := range members {
			if addr, id := m.raft.LeaderWithID(); string(addr) == lnAddr.String() || string(id) == intruderID {
				return true, fmt.Sprintf("%s follows the intruder as raft leader", m.ID())
			}
			if v, ok := accepted.Load(m.ID()); ok {
				return true, fmt.Sprintf("%s accepted the intruder's %s", m.ID(), v)
			}
			if _, ok := m.fsm.session(session); ok {
				return true, fmt.Sprintf("%s applied the intruder's session", m.ID())
			}
		}
		select {
		case <-term.Done():
			return true, fmt.Sprintf("the holder's term ended: %v", term.Err())
		default:
		}
		return false, ""
	})
	close(stop)
	wg.Wait()

	l := readyLeaderOf(t, g)
	if !slices.Contains(members, l) {
		t.Fatalf("the ready raft leader %s is not one of the group's members", l.ID())
	}
	assertHolder(t, b, "job", "holder", term.Token())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if rec, err := b.Leader(ctx, "L"); !errors.Is(err, baton.ErrNoLeader) {
		t.Fatalf("Leader(L) = %+v, %v: want ErrNoLeader (the intruder's acquire must never apply)", rec, err)
	}
	for _, m := range members {
		if _, ok := m.fsm.session(session); ok {
			t.Fatalf("%s has the intruder's session", m.ID())
		}
	}

	// Every member logged a warning naming one of the intruder's
	// connections, and why.
	locals := stream.localAddrs()
	if len(locals) == 0 {
		t.Fatal("the intruder made no connection")
	}
	for i, r := range recs {
		got := r.find(slog.LevelWarn, "peer", locals)
		if len(got) == 0 {
			var lines []string
			for _, rec := range r.all() {
				lines = append(lines, fmt.Sprintf("%s %s %v", rec.level, rec.msg, rec.attrs))
			}
			t.Fatalf("member %d logged no warning naming the intruder (%d connections from %v); its log:\n%s",
				i, len(locals), locals[:min(3, len(locals))], strings.Join(lines, "\n"))
		}
		if reason := got[0].attrs["reason"]; reason != "wrong secret" {
			t.Errorf("member %d's warning gives reason %q, want %q: %+v", i, reason, "wrong secret", got[0])
		}
	}
}
