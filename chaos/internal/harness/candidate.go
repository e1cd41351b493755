package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// errClosing is returned by start once the run is ending.
var errClosing = errors.New("the run is ending")

// candidate is one `baton run`, restarted by the harness after each fault
// that stopped it. Its log (baton's and its children's output) is appended
// to a file in the run's directory.
type candidate struct {
	id  string
	i   int
	h   *Harness
	log *os.File

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	busy bool          // under a fault; the nemesis leaves it alone
	// stopping is set by stop: the exit that follows is the harness's
	// doing. Any other exit is baton's own, and worth a look.
	stopping bool
	// voters is the number of voters in the raft configuration the member
	// last logged (0: none yet).
	voters int
}

// start starts the candidate's baton. It is not running when called.
func (c *candidate) start() error {
	args, env, host := c.h.be.candidate(c.i)
	argv := append([]string{"run"}, args...)
	argv = append(argv, "--lease", "chaos", "--id", c.id,
		"--ttl", c.h.cfg.TTL.String(), "--log-level", "info")
	if c.h.cfg.Grace > 0 {
		argv = append(argv, "--grace", c.h.cfg.Grace.String())
	}
	if c.h.be.members() {
		// The group's longest TTL is the candidates' own: the hold after a
		// recovery from a lost majority (KindRaftMajority) is no longer.
		argv = append(argv, "--max-ttl", c.h.cfg.TTL.String())
	}
	argv = append(argv, "--")
	argv = append(argv, c.h.cfg.Child...)
	argv = append(argv, "--store", c.h.sock, "--candidate", c.id, "--every", c.h.cfg.Heartbeat.String())
	bin := c.h.baton
	if c.h.cfg.Turns > 1 {
		bin, argv = c.turnsArgv(args)
	}
	var cmd *exec.Cmd
	if host != nil {
		cmd = host.Command(context.Background(), bin, argv...)
	} else {
		cmd = exec.Command(bin, argv...)
	}
	cmd.Env = append(os.Environ(), env...)
	// A process group of its own: a ^C to the harness reaches the harness
	// alone, which stops the candidates in order. Should the harness die,
	// its candidates die with it (and their jobs by their guards).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	// Started under the harness's lock, which marks the run ending: once
	// it is, no candidate starts, so none outlives the harness's stop.
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if c.h.closing {
		return errClosing
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start candidate %s: %w", c.id, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done, c.stopping, c.voters = cmd, done, false, 0
	c.mu.Unlock()
	fmt.Fprintf(c.log, "=== baton-chaos: %s started, pid %d, at %s\n", c.id, cmd.Process.Pid, c.h.now())
	go func() {
		c.scan(out)
		_ = cmd.Wait()
		fmt.Fprintf(c.log, "=== baton-chaos: %s exited (%v) at %s\n", c.id, cmd.ProcessState, c.h.now())
		c.mu.Lock()
		unexpected := !c.stopping
		c.mu.Unlock()
		close(done)
		if unexpected {
			c.h.exitedByItself(c, cmd.ProcessState.String())
		}
	}()
	return nil
}

// turnsArgv returns the program and arguments of a candidate process
// with several candidates (Config.Turns): `baton-chaos turns` on the
// backend of args (baton run's --backend), with the ids c.id-1 to
// c.id-Turns: the children's writer (Config.Child) with "turns" first
// (see ChildMain).
func (c *candidate) turnsArgv(args []string) (string, []string) {
	url := ""
	for i, a := range args {
		if a == "--backend" && i+1 < len(args) {
			url = args[i+1]
		}
	}
	ids := make([]string, c.h.cfg.Turns)
	for k := range ids {
		ids[k] = fmt.Sprintf("%s-%d", c.id, k+1)
	}
	return c.h.cfg.Child[0], append(slices.Clone(c.h.cfg.Child[1:]), "turns", "--backend", url, "--lease", "chaos",
		"--ids", strings.Join(ids, ","), "--ttl", c.h.cfg.TTL.String(), "--store", c.h.sock,
		"--every", c.h.cfg.Heartbeat.String(), "--term-max", c.h.cfg.TermMax.String())
}

// scan copies the candidate's output to its log, and notes when it became
// the raft leader and how many voters its configuration has.
func (c *candidate) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(c.log, line)
		if strings.Contains(line, "raft leader ready") {
			c.h.setRaftLeader(c.i)
		}
		if strings.Contains(line, `msg="group configuration"`) {
			if _, rest, ok := strings.Cut(line, "raft.voters="); ok {
				voters, _, _ := strings.Cut(rest, " ")
				c.mu.Lock()
				c.voters = len(strings.Split(voters, ","))
				c.mu.Unlock()
			}
		}
	}
	_, _ = io.Copy(c.log, r)
}

// voterCount returns the number of voters in the configuration the member
// last logged since its start or the last forgetVoters.
func (c *candidate) voterCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.voters
}

// forgetVoters makes voterCount 0 until the member logs its configuration
// again.
func (c *candidate) forgetVoters() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.voters = 0
}

// pid returns the baton's pid and the channel closed when it exits, or 0
// if it is not running.
func (c *candidate) proc() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0, nil
	}
	select {
	case <-c.done:
		return 0, nil
	default:
	}
	return c.cmd.Process.Pid, c.done
}

// signal sends sig to the baton process alone.
func (c *candidate) signal(sig syscall.Signal) error {
	pid, _ := c.proc()
	if pid == 0 {
		return fmt.Errorf("%s is not running", c.id)
	}
	return syscall.Kill(pid, sig)
}

// stop sends sig and waits up to d for the baton to exit, then kills it
// (and, by the guard's socket closing, its command). It reports whether
// the baton exited by itself.
func (c *candidate) stop(sig syscall.Signal, d time.Duration) bool {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	pid, done := c.proc()
	if pid == 0 {
		return true
	}
	_ = syscall.Kill(pid, sig)
	select {
	case <-done:
		return true
	case <-time.After(d):
	}
	// A stopped process would not die of SIGKILL until continued.
	_ = syscall.Kill(pid, syscall.SIGCONT)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-done
	return false
}

// claim marks the candidate busy unless it is already; it reports whether
// it did.
func (c *candidate) claim() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy {
		return false
	}
	c.busy = true
	return true
}

func (c *candidate) release() {
	c.mu.Lock()
	c.busy = false
	c.mu.Unlock()
}

func (c *candidate) isBusy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busy
}
