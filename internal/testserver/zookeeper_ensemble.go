package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Ensemble timing, beyond what every server shares (see ZooKeeperTick).
// ZooKeeper counts both in ticks; these are generous for a loaded two-core
// machine, where a JVM can stall for a second or more. A killed server's
// connections close at once, so neither slows down the failures the tests
// provoke: they only bound how long a stalled peer is waited for.
const (
	// zooKeeperInitLimit is how many ticks a follower has to connect to a
	// new leader and catch up with it (initLimit): 10 s.
	zooKeeperInitLimit = 20
	// zooKeeperSyncLimit is how many ticks a follower may go without
	// hearing from its leader, and the leader from it, before they give up
	// on each other (syncLimit): 5 s.
	zooKeeperSyncLimit = 10
)

// zooKeeperEnsembleStartTimeout bounds an ensemble's start: several JVMs
// starting at once on two cores take longer than one.
const zooKeeperEnsembleStartTimeout = 2 * zooKeeperStartTimeout

// ZooKeeperEnsemble is a quorum of Apache ZooKeeper servers (the Debian
// package's jars, run with java, one JVM each) on 127.0.0.1 only (unless
// ZooKeeperEnsembleOptions say otherwise), each with
// the settings of a standalone ZooKeeper (tickTime 500 ms, minSessionTimeout
// 1 s, empty containers deleted every second). Servers are numbered from 0
// in the methods (their ZooKeeper myid is the index plus one). A test can
// kill servers and start them again, on the same ports and data, to provoke
// leader elections and the loss of the quorum. Its methods are safe for
// concurrent use.
type ZooKeeperEnsemble struct {
	java, cp string
	command  func(i int, name string, arg ...string) *exec.Cmd // nil: exec.Command
	servers  []*ensembleServer

	mu     sync.Mutex // guards each server's jvm, and closed
	closed bool
}

// ensembleServer is one member of an ensemble.
type ensembleServer struct {
	id      int    // ZooKeeper's myid: the index plus one
	dir     string // holds cfgFile and the data directory
	host    string // the address it binds to
	cfgFile string
	addr    string      // client address, HOST:PORT
	log     *SyncBuffer // every run's output, one after another
	jvm     *zooKeeperJVM
}

// who names the server in errors and logs.
func (s *ensembleServer) who() string {
	return fmt.Sprintf("zookeeper server %d (myid %d)", s.id-1, s.id)
}

// ZooKeeperEnsembleOptions configures NewZooKeeperEnsembleWith. The zero
// value is NewZooKeeperEnsemble's ensemble: every server on 127.0.0.1, on
// free ports, started and asked directly by this process.
type ZooKeeperEnsembleOptions struct {
	// Hosts, when set, has one address per server (its length must be the
	// ensemble's size): server i binds its client, quorum and election
	// ports to Hosts[i] alone, and they are ZooKeeper's defaults, 2181,
	// 2888 and 3888, since each address is meant to be a host of its own,
	// such as a network namespace (see internal/netns). Two servers on one
	// address would fight over the ports.
	Hosts []string

	// Command, when set, makes every command run for server i: its JVM
	// and, since an address in another network namespace must be reached
	// from inside it, the four-letter-word probes (srvr for readiness,
	// Mode, LeaderIndex, FourLetter), which then run
	//
	//	bash -c 'exec 3<>/dev/tcp/HOST/PORT && printf %s CMD >&3 && exec cat <&3'
	//
	// through it rather than dialing from this process. It returns a
	// command not yet started, whose process is the program itself (not a
	// wrapper that forks it), so that killing the process kills the
	// server; (*netns.Host).Command qualifies. The ensemble sets the JVM's
	// Dir, Stdout, Stderr and parent-death signal, and the probes' output
	// and WaitDelay. Give Hosts and Command together, or neither (all on
	// 127.0.0.1, run directly).
	Command func(i int, name string, arg ...string) *exec.Cmd
}

// ZooKeeperDefaultPorts are the client, quorum and election ports of the
// servers of an ensemble given ZooKeeperEnsembleOptions.Hosts.
var ZooKeeperDefaultPorts = [3]int{2181, 2888, 3888}

// NewZooKeeperEnsemble starts n servers (n at least 2) that form one
// ensemble, keeping their data and configuration under dir, for callers
// without a testing.TB. It returns once every server answers srvr with
// "Mode: leader" or "Mode: follower" and exactly one says leader. The
// caller must Close it. An error wrapping ErrJavaMissing means java or the
// ZooKeeper jars are not installed.
func NewZooKeeperEnsemble(dir string, n int) (*ZooKeeperEnsemble, error) {
	return NewZooKeeperEnsembleWith(dir, n, ZooKeeperEnsembleOptions{})
}

// NewZooKeeperEnsembleWith is NewZooKeeperEnsemble with options: servers on
// addresses of their own, started through a command of the caller's.
func NewZooKeeperEnsembleWith(dir string, n int, opts ZooKeeperEnsembleOptions) (*ZooKeeperEnsemble, error) {
	if n < 2 {
		return nil, fmt.Errorf("a ZooKeeper ensemble needs at least 2 servers, not %d: for one, use NewZooKeeper", n)
	}
	if opts.Hosts != nil && len(opts.Hosts) != n {
		return nil, fmt.Errorf("zookeeper ensemble of %d servers given %d hosts", n, len(opts.Hosts))
	}
	// Hosts alone would have this process dial the servers' addresses
	// (off the machine, for a namespace's); Command alone would put every
	// server on a loopback of its own, where no quorum can form.
	if (opts.Hosts == nil) != (opts.Command == nil) {
		return nil, errors.New("zookeeper ensemble options: give Hosts and Command together (servers in namespaces of their own), or neither (all on 127.0.0.1)")
	}
	java, cp, err := zooKeeperJava()
	if err != nil {
		return nil, err
	}
	if opts.Command != nil {
		// The probes run bash; better to say so now than as a server
		// that never gets ready.
		if _, err := exec.LookPath("bash"); err != nil {
			return nil, fmt.Errorf("zookeeper ensemble with a Command probes its servers with bash: %w", err)
		}
	}
	attempt := 0
	start := func() (*ZooKeeperEnsemble, error) {
		// A fresh directory per attempt: a failed one may have left data.
		attempt++
		return startZooKeeperEnsemble(java, cp, filepath.Join(dir, "attempt-"+strconv.Itoa(attempt)), n, opts)
	}
	if opts.Hosts != nil {
		// Fixed ports: another attempt would lose the same way.
		return start()
	}
	return retryBindRace(start)
}

func startZooKeeperEnsemble(java, cp, dir string, n int, opts ZooKeeperEnsembleOptions) (*ZooKeeperEnsemble, error) {
	// Three ports per server: clients, the followers' connections to the
	// leader, and leader election. On loopback all are distinct.
	hosts := make([]string, n)
	ports := make([]int, 3*n)
	if opts.Hosts != nil {
		copy(hosts, opts.Hosts)
		for i := range n {
			copy(ports[3*i:], ZooKeeperDefaultPorts[:])
		}
	} else {
		free, err := freeTCPPorts(3 * n)
		if err != nil {
			return nil, err
		}
		copy(ports, free)
		for i := range hosts {
			hosts[i] = "127.0.0.1"
		}
	}
	quorum := []string{
		"initLimit=" + strconv.Itoa(zooKeeperInitLimit),
		"syncLimit=" + strconv.Itoa(zooKeeperSyncLimit),
	}
	for i := range n {
		// The peer addresses bind to the server's host alone
		// (quorumListenOnAllIPs is false by default).
		quorum = append(quorum, fmt.Sprintf("server.%d=%s:%d:%d", i+1, hostForConfig(hosts[i]), ports[3*i+1], ports[3*i+2]))
	}
	e := &ZooKeeperEnsemble{java: java, cp: cp, command: opts.Command}
	for i := range n {
		s := &ensembleServer{
			id:   i + 1,
			dir:  filepath.Join(dir, "server-"+strconv.Itoa(i)),
			host: hosts[i],
			addr: net.JoinHostPort(hosts[i], strconv.Itoa(ports[3*i])),
			log:  new(SyncBuffer),
		}
		data := filepath.Join(s.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			return nil, err
		}
		// The myid file tells the server which server.N line is its own.
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(s.id)+"\n"), 0o644); err != nil {
			return nil, err
		}
		cfg := append(zooKeeperConfig(data, hostForConfig(hosts[i]), ports[3*i]), quorum...)
		s.cfgFile = filepath.Join(s.dir, "zoo.cfg")
		if err := os.WriteFile(s.cfgFile, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
			return nil, err
		}
		e.servers = append(e.servers, s)
	}
	for _, s := range e.servers {
		var err error
		if s.jvm, err = e.startJVM(s); err != nil {
			e.Close()
			return nil, err
		}
	}
	if err := e.awaitQuorum(zooKeeperEnsembleStartTimeout); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// hostForConfig writes an address for zoo.cfg: an IPv6 one in brackets.
func hostForConfig(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// startJVM runs s's server.
func (e *ZooKeeperEnsemble) startJVM(s *ensembleServer) (*zooKeeperJVM, error) {
	return startZooKeeperJVM(e.serverCommand(s), e.java, e.cp, s.dir, "org.apache.zookeeper.server.quorum.QuorumPeerMain", s.cfgFile, nil, s.log)
}

// serverCommand returns the command maker for s's programs, nil for
// exec.Command.
func (e *ZooKeeperEnsemble) serverCommand(s *ensembleServer) func(name string, arg ...string) *exec.Cmd {
	if e.command == nil {
		return nil
	}
	return func(name string, arg ...string) *exec.Cmd { return e.command(s.id-1, name, arg...) }
}

// fourLetterTimeout bounds a four-letter-word probe run through a Command,
// as fourLetter's deadlines bound one dialed from here.
const fourLetterTimeout = 5 * time.Second

// fourLetter sends a four-letter-word command to s's client port: dialed
// from this process, or with a Command from a bash run through it.
func (e *ZooKeeperEnsemble) fourLetter(s *ensembleServer, cmd string) (string, error) {
	if e.command == nil {
		return fourLetter(s.addr, cmd)
	}
	_, port, err := net.SplitHostPort(s.addr)
	if err != nil {
		return "", err
	}
	// bash's /dev/tcp takes the address unbracketed; cmd is one of the
	// four-letter words, but is quoted all the same. cat is exec'd, not
	// forked: killing the process then leaves nothing holding the output
	// pipe.
	script := fmt.Sprintf("exec 3<>/dev/tcp/%s/%s && printf %%s %s >&3 && exec cat <&3", s.host, port, shellQuote(cmd))
	c := e.command(s.id-1, "bash", "-c", script)
	var out, stderr bytes.Buffer
	c.Stdout, c.Stderr = &out, &stderr
	if c.SysProcAttr == nil {
		c.SysProcAttr = &syscall.SysProcAttr{}
	}
	c.SysProcAttr.Pdeathsig = syscall.SIGKILL
	c.WaitDelay = time.Second
	if err := c.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	timer := time.NewTimer(fourLetterTimeout)
	defer timer.Stop()
	select {
	case err = <-done:
	case <-timer.C:
		_ = c.Process.Kill()
		<-done
		return "", fmt.Errorf("%s to %s: no answer within %s", cmd, s.addr, fourLetterTimeout)
	}
	if err != nil {
		return "", fmt.Errorf("%s to %s: %v: %s", cmd, s.addr, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out.String(), nil
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// awaitQuorum polls srvr on every server until each serves as leader or
// follower and exactly one is the leader. A server that exits first fails
// it with an *earlyExitError (a lost race for a port among them).
func (e *ZooKeeperEnsemble) awaitQuorum(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var (
			leaders int
			waiting []string
		)
		for _, s := range e.servers {
			e.mu.Lock()
			p := s.jvm
			e.mu.Unlock()
			if p == nil {
				return fmt.Errorf("%s was killed before the ensemble was ready", s.who())
			}
			select {
			case <-p.exited:
				return &earlyExitError{who: s.who(), err: p.waitErr, log: s.log.String()}
			default:
			}
			out, err := e.fourLetter(s, "srvr")
			switch mode := srvrMode(out); {
			case err != nil:
				waiting = append(waiting, fmt.Sprintf("%s: %v", s.who(), err))
			case mode == "leader":
				leaders++
			case mode != "follower":
				waiting = append(waiting, fmt.Sprintf("%s: srvr answered %q", s.who(), out))
			}
		}
		if len(waiting) == 0 && leaders == 1 {
			return nil
		}
		if len(waiting) == 0 {
			waiting = append(waiting, fmt.Sprintf("%d servers say they lead", leaders))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zookeeper ensemble not ready within %s: %s; the servers' logs:\n%s",
				timeout, strings.Join(waiting, "; "), e.logs())
		}
		<-tick.C
	}
}

// srvrMode returns the mode in an answer to srvr ("leader", "follower",
// "standalone"), or "" when there is none, as from a server that is not
// serving.
func srvrMode(out string) string {
	for line := range strings.Lines(out) {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(mode)
		}
	}
	return ""
}

// server returns server i, or an error if there is no such server.
func (e *ZooKeeperEnsemble) server(i int) (*ensembleServer, error) {
	if i < 0 || i >= len(e.servers) {
		return nil, fmt.Errorf("no zookeeper server %d: the ensemble has %d", i, len(e.servers))
	}
	return e.servers[i], nil
}

// Len returns the number of servers, running or not.
func (e *ZooKeeperEnsemble) Len() int { return len(e.servers) }

// Addrs returns the servers' client addresses ("127.0.0.1:PORT", or
// "HOST:2181" with ZooKeeperEnsembleOptions.Hosts), in the
// order of their indexes: the connection string of the ensemble. A killed
// server keeps its address, and a restarted one serves on it again.
func (e *ZooKeeperEnsemble) Addrs() []string {
	addrs := make([]string, len(e.servers))
	for i, s := range e.servers {
		addrs[i] = s.addr
	}
	return addrs
}

// Index returns the index of the server whose client address is addr, as
// reported by (*zk.Conn).Server, or -1 if none.
func (e *ZooKeeperEnsemble) Index(addr string) int {
	for i, s := range e.servers {
		if s.addr == addr {
			return i
		}
	}
	return -1
}

// FourLetter sends a four-letter-word command (srvr, ruok, cons, stat, mntr
// and wchp are enabled) to server i's client port and returns the answer.
func (e *ZooKeeperEnsemble) FourLetter(i int, cmd string) (string, error) {
	s, err := e.server(i)
	if err != nil {
		return "", err
	}
	return e.fourLetter(s, cmd)
}

// Mode returns what server i's srvr says it is: "leader" or "follower"
// while it serves in a quorum, "" when it does not serve (it is killed, or
// looking for a leader).
func (e *ZooKeeperEnsemble) Mode(i int) string {
	out, err := e.FourLetter(i, "srvr")
	if err != nil {
		return ""
	}
	return srvrMode(out)
}

// LeaderIndex returns the index of the server whose srvr says it is the
// leader, or -1 if none does (the quorum is lost, or an election is under
// way). Should two say so, as for a moment after a partition, it returns
// the lower index.
func (e *ZooKeeperEnsemble) LeaderIndex() int {
	for i := range e.servers {
		if e.Mode(i) == "leader" {
			return i
		}
	}
	return -1
}

// Running reports whether server i's JVM runs: it was neither killed nor
// has it exited.
func (e *ZooKeeperEnsemble) Running(i int) bool {
	s, err := e.server(i)
	if err != nil {
		return false
	}
	e.mu.Lock()
	p := s.jvm
	e.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Kill kills server i with SIGKILL, as a crash would: its clients' and
// peers' connections close at once, without a goodbye. It returns once the
// JVM has exited. Killing a server that was killed already does nothing;
// an index out of range panics, as a slice's would.
func (e *ZooKeeperEnsemble) Kill(i int) {
	s, err := e.server(i)
	if err != nil {
		panic(err)
	}
	e.mu.Lock()
	p := s.jvm
	e.mu.Unlock()
	if p == nil {
		return
	}
	p.kill()
	// Cleared only once the JVM is gone, so that a Restart meanwhile does
	// not start another on the ports it still holds.
	e.mu.Lock()
	if s.jvm == p {
		s.jvm = nil
	}
	e.mu.Unlock()
	fmt.Fprintf(s.log, "--- %s killed (SIGKILL) at %s ---\n", s.who(), time.Now().Format(time.StampMilli))
}

// Restart starts server i again, after Kill, with the same ports and data
// directory, and returns once it serves as leader or follower: it has
// found the quorum's leader (or become it) and caught up. A quorum must be
// able to form: a majority of the servers must be running once it is.
func (e *ZooKeeperEnsemble) Restart(i int) error {
	s, err := e.server(i)
	if err != nil {
		return err
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return fmt.Errorf("restart %s: the ensemble is closed", s.who())
	}
	if s.jvm != nil {
		select {
		case <-s.jvm.exited:
		default:
			e.mu.Unlock()
			return fmt.Errorf("restart %s: it is running; Kill it first", s.who())
		}
	}
	fmt.Fprintf(s.log, "--- %s restarted at %s ---\n", s.who(), time.Now().Format(time.StampMilli))
	p, err := e.startJVM(s)
	if err != nil {
		e.mu.Unlock()
		return err
	}
	s.jvm = p
	e.mu.Unlock()
	return awaitMode(func(cmd string) (string, error) { return e.fourLetter(s, cmd) }, p, s.who(), s.log, zooKeeperStartTimeout, func(out string) bool {
		mode := srvrMode(out)
		return mode == "leader" || mode == "follower"
	})
}

// Log returns what server i has logged so far (warnings and errors), over
// all its runs, with a line marking each kill and restart.
func (e *ZooKeeperEnsemble) Log(i int) string {
	s, err := e.server(i)
	if err != nil {
		return ""
	}
	return s.log.String()
}

// logs returns every server's log, each under a heading.
func (e *ZooKeeperEnsemble) logs() string {
	var b strings.Builder
	for _, s := range e.servers {
		fmt.Fprintf(&b, "=== %s, client address %s ===\n%s", s.who(), s.addr, s.log)
	}
	return b.String()
}

// Close kills every server and waits for them to exit. Calling it again is
// harmless; Restart fails after it.
func (e *ZooKeeperEnsemble) Close() {
	e.mu.Lock()
	e.closed = true
	var running []*zooKeeperJVM
	for _, s := range e.servers {
		if s.jvm != nil {
			running = append(running, s.jvm)
			s.jvm = nil
		}
	}
	e.mu.Unlock()
	for _, p := range running {
		p.kill()
	}
}

// StartZooKeeperEnsemble starts an ensemble of n servers in a fresh
// t.TempDir and closes it when the test ends; the servers' logs are shown
// if the test fails. Missing java or ZooKeeper jars go through Unavailable
// (skip, or fail under BATON_REQUIRE_SERVERS=1); installed servers that
// fail to start fail the test.
func StartZooKeeperEnsemble(t testing.TB, n int) *ZooKeeperEnsemble {
	t.Helper()
	return StartZooKeeperEnsembleWith(t, n, ZooKeeperEnsembleOptions{})
}

// StartZooKeeperEnsembleWith is StartZooKeeperEnsemble with options (see
// NewZooKeeperEnsembleWith).
func StartZooKeeperEnsembleWith(t testing.TB, n int, opts ZooKeeperEnsembleOptions) *ZooKeeperEnsemble {
	t.Helper()
	e, err := NewZooKeeperEnsembleWith(t.TempDir(), n, opts)
	if errors.Is(err, ErrJavaMissing) {
		Unavailable(t, "zookeeper", err)
	}
	if err != nil {
		t.Fatalf("start zookeeper ensemble: %v", err)
	}
	// Registered before Close, so that it runs after it (cleanups run
	// last-in first-out): the logs then end with each server's last word.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("zookeeper ensemble logs:\n%s", e.logs())
		}
	})
	t.Cleanup(e.Close)
	return e
}
