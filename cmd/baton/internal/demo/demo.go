// Package demo is `baton demo`: a local raft group of baton processes whose
// leaders it kills, alternating kill -9 and SIGTERM, timing each failover
// from the lease events of a member of its own.
package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/raft"
	"github.com/batonhq/baton/discovery"
	"github.com/batonhq/baton/supervise"
)

// Lease is the lease the demo's nodes contend for.
const Lease = "demo"

// Config is one demo's settings, checked by the caller.
type Config struct {
	Nodes    int           // nodes to run, 3 to 9
	Rounds   int           // leaders to kill before stopping
	TTL      time.Duration // the nodes' lease TTL
	Interval time.Duration // how long each leader leads before it is killed
	Verbose  bool          // also show every line of the nodes' output and logs

	// Exe is the baton binary the nodes run (`baton run ... -- baton
	// demo-job`), with Env as their environment.
	Exe string
	Env []string
	// Out receives the timeline and the summary.
	Out io.Writer
}

// Run runs the demo until c.Rounds kills are done or ctx ends.
func Run(ctx context.Context, c Config) error {
	start := time.Now()
	group, err := newGroup(c.Nodes)
	if err != nil {
		return err
	}
	// The demo watches the lease as one more member of the group, a
	// non-voter that campaigns for nothing: it sees each change as it is
	// applied, without polling.
	peers, err := discovery.Static(group.addrs...)
	if err != nil {
		return err
	}
	node, err := raft.StartNode(raft.NodeOptions{
		BindAddr:  "127.0.0.1:0",
		Secret:    group.secret,
		Discovery: peers,
	})
	if err != nil {
		return fmt.Errorf("starting the observing member: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = node.Close(ctx)
	}()
	observer, err := raft.New(node, raft.Options{Config: backend.Config{TTL: c.TTL}, StaleReads: true})
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = observer.Close(ctx)
	}()

	d := &demo{
		c:        c,
		group:    group,
		out:      c.Out,
		start:    start,
		events:   make(chan event, 64),
		quit:     make(chan struct{}),
		observer: node,
	}
	d.printf("starting %d nodes: one raft group on 127.0.0.1 (one secret, nothing else: TLS 1.3, each node's certificate its own; lease %q, --ttl %s)", c.Nodes, Lease, c.TTL)
	return d.run(ctx, node, observer)
}

// group is the demo's secret and member addresses. The secret is all the
// nodes share: each makes its own key and certificate at start (the
// secret-only mode), so nothing goes to disk.
type group struct {
	secret string
	addrs  []string // node K listens on addrs[K-1]
}

func newGroup(nodes int) (*group, error) {
	var b [32]byte
	_, _ = rand.Read(b[:])
	g := &group{secret: hex.EncodeToString(b[:])}
	for range nodes {
		// A port the kernel just handed out; the node binds it itself.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		g.addrs = append(g.addrs, ln.Addr().String())
		ln.Close()
	}
	return g, nil
}

// demo is one run of `baton demo`. Only the goroutine in run touches its
// node and timing state; the others send events.
type demo struct {
	c      Config
	group  *group
	out    io.Writer
	start  time.Time
	events chan event
	quit   chan struct{} // closed when run stops reading events
	wg     sync.WaitGroup
	// observer is the demo's own, non-voting member of the group.
	observer *raft.Node

	nodes []*nodeProc
}

type nodeProc struct {
	name string
	proc *supervise.Process
}

type eventKind int

const (
	leaderChanged eventKind = iota // holder, token (holder "" if none)
	nodeExited                     // node, proc, code
	jobOutput                      // node, line
	nodeLog                        // node, line
)

type event struct {
	kind   eventKind
	at     time.Time
	node   int
	proc   *supervise.Process
	code   int
	holder string
	token  uint64
	line   string
	err    error
}

// send hands e to the run loop unless it has stopped.
func (d *demo) send(e event) {
	e.at = time.Now()
	select {
	case d.events <- e:
	case <-d.quit:
	}
}

func (d *demo) printf(format string, args ...any) {
	el := time.Since(d.start).Seconds()
	fmt.Fprintf(d.out, "%7.2fs  %s\n", el, fmt.Sprintf(format, args...))
}

// kill is a leader kill whose failover has not been observed yet.
type kill struct {
	crash bool // kill -9, else SIGTERM
	at    time.Time
	node  int
	token uint64
}

func (d *demo) run(ctx context.Context, node *raft.Node, observer *raft.Backend) error {
	watchCtx, stopWatch := context.WithCancel(ctx)
	d.wg.Go(func() { d.observe(watchCtx, node, observer) })
	defer func() {
		stopWatch()
		close(d.quit)
		d.wg.Wait()
	}()
	defer d.stopAll()

	for i := range d.c.Nodes {
		d.nodes = append(d.nodes, &nodeProc{name: fmt.Sprintf("node-%d", i+1)})
		if err := d.startNode(i); err != nil {
			return err
		}
	}

	var (
		holder     string
		token      uint64
		pending    *kill
		kills      int
		crash      []time.Duration
		graceful   []time.Duration
		restart    = map[int]bool{} // victims to restart once they exited
		jobToken   = map[int]uint64{}
		unexpected int
		killTimer  <-chan time.Time
	)
	const firstLeaderWait = 30 * time.Second
	waitTimer := time.NewTimer(firstLeaderWait)
	defer waitTimer.Stop()
	failoverWait := 3*d.c.TTL + 10*time.Second

	summary := func(why string) {
		fmt.Fprintf(d.out, "\nsummary (%s): %d kill(s), %d nodes, --ttl %s\n", why, kills, d.c.Nodes, d.c.TTL)
		fmt.Fprintf(d.out, "  crash failover (kill -9):      %s\n", stats(crash))
		fmt.Fprintf(d.out, "      the standbys waited for the dead leader's session to expire (about --ttl;\n")
		fmt.Fprintf(d.out, "      up to half a raft heartbeat timeout more when the dead node was also the raft leader)\n")
		fmt.Fprintf(d.out, "  graceful hand-over (SIGTERM):  %s\n", stats(graceful))
		fmt.Fprintf(d.out, "      the leader stopped its job and resigned; a standby took over at once\n")
	}

	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(d.out)
			d.printf("interrupted (%v); stopping the nodes", context.Cause(ctx))
			d.stopAll()
			summary("interrupted")
			return nil

		case <-waitTimer.C:
			if pending != nil {
				return fmt.Errorf("no new leader within %s of the last kill; run with --verbose to see the nodes' logs", failoverWait)
			}
			return fmt.Errorf("no node became leader within %s; run with --verbose to see the nodes' logs", firstLeaderWait)

		case <-killTimer:
			killTimer = nil
			victim := d.nodeIndex(holder)
			if victim < 0 {
				// The holder is not (or no longer) one of ours; wait for
				// the next leader.
				continue
			}
			k := &kill{crash: kills%2 == 0, at: time.Now(), node: victim, token: token}
			p := d.nodes[victim].proc
			also := ""
			if d.group.addrs[victim] == node.Status().LeaderAt {
				also = " (also the raft leader: the group elects a new one first)"
			}
			if k.crash {
				d.printf("kill -9 %s%s", holder, also)
				_ = p.Signal(syscall.SIGKILL)
			} else {
				d.printf("SIGTERM %s%s", holder, also)
				_ = p.Signal(syscall.SIGTERM)
			}
			kills++
			pending = k
			restart[victim] = true
			waitTimer.Reset(failoverWait)

		case e := <-d.events:
			switch e.kind {
			case leaderChanged:
				if e.err != nil {
					d.printf("cannot read the leader: %v", e.err)
					continue
				}
				if e.holder == holder && e.token == token {
					continue
				}
				holder, token = e.holder, e.token
				if holder == "" {
					if d.c.Verbose {
						d.printf("no leader")
					}
					continue
				}
				msg := fmt.Sprintf("%s leads (token %d)", holder, token)
				if pending != nil && token > pending.token {
					took := e.at.Sub(pending.at)
					if pending.crash {
						crash = append(crash, took)
						msg += " — failover " + fmtDuration(took)
					} else {
						graceful = append(graceful, took)
						msg += " — hand-over " + fmtDuration(took)
					}
					pending = nil
				}
				d.printf("%s", msg)
				if pending == nil {
					if kills >= d.c.Rounds {
						d.printf("%d kills done; stopping the nodes", kills)
						d.stopAll()
						summary("done")
						return nil
					}
					waitTimer.Stop()
					killTimer = time.After(d.c.Interval)
				}

			case nodeExited:
				n := d.nodes[e.node]
				if n.proc != e.proc {
					continue // an earlier incarnation
				}
				if restart[e.node] {
					delete(restart, e.node)
				} else {
					unexpected++
					d.printf("%s exited unexpectedly (status %d)", n.name, e.code)
					if unexpected > 3*d.c.Nodes {
						return errors.New("the nodes keep exiting; run with --verbose to see their logs")
					}
				}
				if err := d.startNode(e.node); err != nil {
					return err
				}
				d.printf("%s restarted", n.name)

			case jobOutput:
				// The first line of the leader's job in each term, as the
				// lease events tell the terms apart.
				leads := d.nodes[e.node].name == holder
				if d.c.Verbose {
					d.printf("%s | %s", d.nodes[e.node].name, e.line)
				} else if leads && jobToken[e.node] != token {
					d.printf("%s job running: %q", d.nodes[e.node].name, e.line)
				}
				if leads {
					jobToken[e.node] = token
				}

			case nodeLog:
				d.printf("%s ! %s", d.nodes[e.node].name, e.line)
			}
		}
	}
}

func (d *demo) nodeIndex(name string) int {
	return slices.IndexFunc(d.nodes, func(n *nodeProc) bool { return n.name == name })
}

// startNode starts node i as `baton run ... -- baton demo-job`.
func (d *demo) startNode(i int) error {
	n := d.nodes[i]
	g := d.group
	args := []string{d.c.Exe, "run",
		"--backend", "raft://",
		"--bind", g.addrs[i],
		"--join", "static:" + strings.Join(g.addrs, ","),
		"--bootstrap-expect", "3",
		"--lease", Lease,
		"--id", n.name,
		"--ttl", d.c.TTL.String(),
		"--",
		d.c.Exe, "demo-job",
	}
	cfg := supervise.Config{
		Command: args,
		Env:     append(slices.Clone(d.c.Env), "BATON_SECRET="+g.secret),
		Stdout: &lineWriter{fn: func(line string) {
			d.send(event{kind: jobOutput, node: i, line: line})
		}},
		Grace: 5 * time.Second,
	}
	if d.c.Verbose {
		cfg.Stderr = &lineWriter{fn: func(line string) {
			d.send(event{kind: nodeLog, node: i, line: line})
		}}
	}
	p, err := supervise.Start(cfg)
	if err != nil {
		return fmt.Errorf("starting %s: %w", n.name, err)
	}
	n.proc = p
	d.wg.Go(func() {
		<-p.Done()
		d.send(event{kind: nodeExited, node: i, proc: p, code: p.ExitCode()})
	})
	return nil
}

// stopAll stops every node the way an operator would, with SIGTERM, and
// waits for all of them; each node stops its job and resigns first.
//
// Each member leaves the group as it stops, which needs a raft leader and a
// quorum. So the members stop one at a time, each after the last has left:
// the group shrinks by one member at each step and keeps its quorum
// throughout, whatever the load on the machine. The demo's observing member
// goes first and the raft leader last, which spares leadership transfers;
// the last member finds itself alone, with nothing to hand over or leave.
// Stopped all at once, the members could lose their quorum mid-way and
// each wait out its close timeout.
func (d *demo) stopAll() {
	// The nodes' last output and exit reports arrive while they stop; keep
	// reading them so that the copying goroutines never block, and show the
	// nodes' logs with --verbose.
	drained := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case e := <-d.events:
				if e.kind == nodeLog {
					d.printf("%s ! %s", d.nodes[e.node].name, e.line)
				}
			case <-stopped:
				return
			}
		}
	}()
	defer func() { close(stopped); <-drained }()
	leaderAt := ""
	if d.observer != nil {
		leaderAt = d.observer.Status().LeaderAt
		// Closing again later (Run's deferred close) is a no-op.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.observer.Close(ctx)
		cancel()
	}
	var last *nodeProc
	stop := func(n *nodeProc) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_ = n.proc.Stop(ctx)
	}
	for i, n := range d.nodes {
		if n.proc == nil {
			continue
		}
		if leaderAt != "" && d.group.addrs[i] == leaderAt {
			last = n
			continue
		}
		stop(n)
	}
	if last != nil {
		stop(last)
	}
}

// observe reports the leader each time the demo lease changes in the
// observing member's copy of the log.
func (d *demo) observe(ctx context.Context, node *raft.Node, observer *raft.Backend) {
	select {
	case <-node.Joined():
	case <-ctx.Done():
		return
	}
	for {
		changed := node.Changed(Lease) // before the read: no change falls between
		rec, err := observer.Leader(ctx, Lease)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, baton.ErrNoLeader) {
			err = nil
		}
		d.send(event{kind: leaderChanged, holder: rec.Holder, token: rec.Token, err: err})
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

func stats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var median time.Duration
	if len(s)%2 == 1 {
		median = s[len(s)/2]
	} else {
		median = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%d×  median %s  max %s", len(s), fmtDuration(median), fmtDuration(s[len(s)-1]))
}

func fmtDuration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// lineWriter calls fn with each complete line written to it. Writes come
// from one copying goroutine per stream.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.fn(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
