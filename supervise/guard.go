//go:build linux || darwin

package supervise

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/batonhq/baton/internal/proctree"
	"golang.org/x/sys/unix"
)

// guardEnv marks a process started by Start as a guard; the guard removes
// it from the command's environment.
const guardEnv = "BATON_SUPERVISE_GUARD"

// guardName is the guard's process name (comm), which ps shows.
const guardName = "baton-guard"

// guardFD is the guard's end of the socket to its parent.
const guardFD = 3

// killRetry is how often a guard that has sent SIGKILL sends it again to
// whatever is still left: a descendant may fork between a scan of the
// process table and the kill.
const killRetry = 10 * time.Millisecond

// init runs the guard in a process that Start started as one, before most
// of the program's package initialisers: Go initialises packages in the
// order of their import paths, each once its imports are, so this package
// comes early, after its few imports. The initialisers of a program's other
// packages (a Kubernetes client's scheme, protobuf registries) can take
// tens of milliseconds; a guard must not wait for them, since a new term's
// command starts only once its guard runs.
func init() { GuardMain() }

// GuardMain runs the guard and exits if this process was started by Start
// as one; otherwise it returns at once. The package's initialiser calls it,
// so a program that imports this package runs as a guard before its own
// main when Start started it as one; calling it first thing in main, and in
// TestMain of tests that use Start, does no harm, and keeps a program right
// that starts its guards some other way.
func GuardMain() {
	if os.Getenv(guardEnv) != "1" {
		return
	}
	os.Exit(guardMain())
}

// guardMain is the guard: it starts the command and stops it and all its
// descendants when told to, when the deadline passes unextended or when its
// parent is gone, and returns once they are all gone.
func guardMain() int {
	// The command's parent-death signal fires when the thread that forked
	// it exits; this thread never does before the process.
	runtime.LockOSThread()
	nameGuard()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "baton guard: "+format+"\n", args...)
		return 2
	}
	syscall.CloseOnExec(guardFD)
	if typ, err := unix.GetsockoptInt(guardFD, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
		return fail("fd %d is not the socket to the parent (%v); the guard is started by supervise.Start, not by hand", guardFD, err)
	}
	// Non-blocking, so that the File is pollable: deadlines on writes, and
	// drain's reads that never wait.
	if err := syscall.SetNonblock(guardFD, true); err != nil {
		return fail("fd %d: %v", guardFD, err)
	}
	conn := os.NewFile(guardFD, "supervise-guard")

	g := &guard{conn: conn, notes: make(chan string, 16)}
	// Everything that does not depend on the command is done before it is
	// given: a guard started ahead of its command (Prepare) then starts it
	// with one fork, at the start of a term.
	//
	// Orphans below the guard, double-forked or setsid or not, become its
	// children instead of init's: none can leave the tree it reaps.
	if err := guardSubreaper(); err != nil {
		return fail("%v", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// A write to a stderr whose reader is gone must fail, not kill the
	// guard (Go's default for fd 1 and 2). Caught, not ignored: an ignored
	// signal would stay ignored in the command across exec. The signals the
	// caller forwards (DefaultForwardSignals) reach the command through the
	// caller, which relays them over the socket; sent to the guard itself
	// (`pkill -HUP baton` matches it too), SIGHUP and SIGQUIT would kill it
	// by Go's default and leave escaped descendants unguarded, so they are
	// caught and dropped here.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	signal.Notify(make(chan os.Signal, 8), DefaultForwardSignals()...)
	go g.printer()
	g.cg = newCgroup()
	defer func() {
		if g.pid == 0 && g.cg != nil {
			g.cg.remove() // no command ran in it
		}
	}()

	// The command, read on this thread beside the signals: a waiting guard
	// told to stop by SIGTERM or SIGINT ends without starting one. The
	// thread waits in poll(2) itself, so the command's arrival wakes it
	// directly, not through another thread that hands it over (waking a
	// locked thread from another costs a thread switch, and milliseconds at
	// the tail on a busy machine); the command comes as a few writes, read
	// whole.
	wait, err := newCommandWait(sigs)
	if err != nil {
		return fail("%v", err)
	}
	c, signalled := wait.read()
	if signalled {
		return 0
	}
	if errors.Is(c.err, io.EOF) && !c.heard {
		return 0
	}
	if c.err != nil {
		return fail("parent gone before the command started: %v", c.err)
	}
	path, argv, env := c.path, c.argv, c.env
	g.inbuf = c.rest
	g.grace, g.deadline = c.grace, c.deadline
	if c.noCgroup && g.cg != nil {
		g.cg.remove()
		g.cg = nil
	}

	if path == "" || len(argv) == 0 {
		return fail("given no command; the guard is started by supervise.Start, not by hand")
	}
	if err := g.start(path, argv, env); err != nil {
		var errno syscall.Errno
		errors.As(err, &errno)
		g.send(encodeStartErr(int64(errno), err.Error()))
		return 1
	}
	// The loop runs on whichever thread the runtime has at hand: each of
	// its wake-ups (a message, a reaped child) is then taken by the thread
	// that saw it, not handed over to this one. This thread, which forked
	// the command, stays alive until the guard exits (see LockOSThread
	// above).
	code := make(chan int, 1)
	go func() { code <- g.run(wait.sigs) }()
	return <-code
}

type guard struct {
	conn  *os.File        // the socket to the parent
	rc    syscall.RawConn // conn's descriptor, read by drain
	inbuf []byte          // bytes read from conn, not yet a whole message

	parentGone bool  // the parent's end of the socket closed
	grace      int64 // nanoseconds
	deadline   int64 // CLOCK_MONOTONIC nanoseconds; 0: none

	pid int     // the command, also its process group
	cg  *cgroup // the command's cgroup, or nil

	// lingering: the command was reaped and the guard has no child left,
	// but members of the command's process group live on elsewhere in the
	// process tree (only where the guard is not a subreaper: see
	// groupLingers). The guard polls the group until it is empty.
	lingering bool

	notes chan string // for printer

	stopping bool  // SIGTERM sent
	killAt   int64 // CLOCK_MONOTONIC nanoseconds of the SIGKILL; 0 none yet
	killing  bool  // SIGKILL sent; repeated until all are gone
	reaped   bool  // the command was reaped: its pid may be reused
}

// send writes a report to the parent; a parent that is gone or does not
// read must not stop the guard from guarding.
func (g *guard) send(b []byte) {
	_ = g.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, _ = g.conn.Write(b)
}

type reaped struct {
	pid    int
	status syscall.WaitStatus
	none   bool // no child is left
}

// reap reaps every child of the guard (the command and every orphan that
// the subreaper setting brought in) until none is left.
func reap(ch chan<- reaped) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.ECHILD):
			ch <- reaped{none: true}
			return
		case err != nil:
			// Not possible with these arguments; keep the guard from
			// spinning should it happen anyway.
			time.Sleep(killRetry)
			continue
		}
		ch <- reaped{pid: pid, status: ws}
	}
}

// waitReadable tells the guard's loop, on ready, each time the parent's end
// of the socket has something to read (or closed), and waits for again
// before it looks once more: the loop reads the bytes itself, with drain.
func waitReadable(rc syscall.RawConn, ready chan<- struct{}, again <-chan struct{}) {
	for {
		err := rc.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR)
		})
		if err != nil {
			return
		}
		ready <- struct{}{}
		<-again
	}
}

// drain handles every message the parent has written so far, without
// waiting for more, and notes a parent whose end of the socket closed.
// Extensions of the deadline queue in the socket while the guard is
// stopped (SIGSTOP) and the parent goes on renewing: read before the
// deadline is judged, they keep a resumed guard from killing a command
// whose term goes on.
func (g *guard) drain() {
	var b [4096]byte
	for !g.parentGone {
		var n int
		var err error
		// Control, not Read: waitReadable holds the descriptor's read lock
		// while it waits, and this read must not wait.
		if rerr := g.rc.Control(func(fd uintptr) {
			n, err = unix.Read(int(fd), b[:])
		}); rerr != nil {
			err = rerr
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil || n == 0 {
			g.parentGone = true
			break
		}
		g.inbuf = append(g.inbuf, b[:n]...)
	}
	// The parent sends only fixed-size messages once the command runs.
	for len(g.inbuf) >= 9 {
		m, _ := readMessage(bytes.NewReader(g.inbuf[:9]))
		g.inbuf = g.inbuf[9:]
		g.handle(m)
	}
	if g.parentGone && !g.stopping {
		g.say("the parent is gone (its end of the socket closed); stopping the command")
		g.stop(reasonParentGone)
	}
}

func (g *guard) run(sigs <-chan os.Signal) int {
	reaps := make(chan reaped, 16)
	go reap(reaps)
	rc, err := g.conn.SyscallConn()
	if err != nil {
		// A File on a socket always has one.
		panic("supervise: the guard's socket: " + err.Error())
	}
	g.rc = rc
	if len(g.inbuf) > 0 {
		g.drain() // what came with the command
	}
	ready, again := make(chan struct{}), make(chan struct{})
	go waitReadable(rc, ready, again)

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		g.arm(timer)
		select {
		case <-ready:
			g.drain()
			if g.parentGone {
				ready = nil
			} else {
				again <- struct{}{}
			}
		case r := <-reaps:
			if r.none && g.groupLingers() {
				reaps = nil
				g.lingering = true
				break
			}
			if r.none {
				if g.cg != nil {
					g.cg.remove()
				}
				g.gone()
				return 0
			}
			if r.pid == g.pid {
				g.reaped = true
				g.send(encode(msgExited, int64(exitCode(r.status))))
			}
		case <-sigs:
			g.say("got SIGTERM/SIGINT; stopping the command")
			g.stop(reasonSignal)
		case <-timer.C:
		}
		g.tick()
		if g.lingering && !g.groupLingers() {
			g.gone()
			return 0
		}
	}
}

// gone tells the parent that the command's tree is gone, before the guard
// exits: the parent need not wait for this process's own teardown to act
// on it.
func (g *guard) gone() { g.send(encode(msgGone, 0)) }

func (g *guard) handle(m message) {
	switch m.typ {
	case msgDeadline:
		if m.val > g.deadline {
			g.deadline = m.val
		}
	case msgSignal:
		g.signalGroup(syscall.Signal(m.val))
	case msgStop:
		g.stop(0)
	case msgKill:
		g.kill()
	}
}

// tick acts on the deadline and the pending SIGKILL.
func (g *guard) tick() {
	now := monotonicNow()
	if g.deadline != 0 && !g.stopping && now >= g.deadline-g.grace {
		// A guard resumed after a stop may have extensions waiting.
		g.drain()
		now = monotonicNow()
	}
	if g.deadline != 0 && !g.stopping && now >= g.deadline-g.grace {
		g.say("the deadline is %s away without an extension; stopping the command",
			time.Duration(g.deadline-now).Round(time.Millisecond))
		g.stop(reasonDeadline)
	}
	if g.killAt != 0 && now >= g.killAt {
		due := g.killAt
		g.kill()
		if done := monotonicNow(); g.deadline != 0 && done >= g.deadline {
			// An overrun of the lease is never silent. Due KillLead
			// before the deadline, the kill is late only when the host
			// did not run the guard in time (CPU starvation, a pause of
			// the guard alone), which nothing the guard does can make up
			// for; due later, the guard's own schedule was wrong.
			if due <= g.deadline-int64(KillLead) {
				g.say("the SIGKILL of the command's tree was done %s after the deadline, %s after it was due: this host did not run the guard in time, and the command may have run past its lease's safe-until",
					time.Duration(done-g.deadline).Round(time.Millisecond), time.Duration(done-due).Round(time.Millisecond))
			} else {
				g.say("the SIGKILL of the command's tree was due %s after the deadline (a fault in the guard), and the command may have run past its lease's safe-until",
					time.Duration(due-g.deadline).Round(time.Millisecond))
			}
		}
	}
	if g.killing {
		// Whatever survived the last round (it forked meanwhile) gets it now.
		g.killTree()
	}
}

// arm sets timer to the next moment tick has something to do.
func (g *guard) arm(timer *time.Timer) {
	next := int64(0)
	consider := func(at int64) {
		if at != 0 && (next == 0 || at < next) {
			next = at
		}
	}
	if g.deadline != 0 && !g.stopping {
		consider(g.deadline - g.grace)
	}
	consider(g.killAt)
	if g.killing {
		consider(monotonicNow() + int64(killRetry))
	}
	if g.lingering {
		consider(monotonicNow() + int64(lingerPoll))
	}
	timer.Stop()
	if next == 0 {
		return
	}
	timer.Reset(time.Duration(max(next-monotonicNow(), 0)))
}

// say tells the operator what the guard does on its own: its parent may be
// unable to. It never blocks: stderr may be a pipe whose reader is stopped
// (a shell pipeline's process group stopped with the caller), and the guard
// must act all the same; a note that does not fit is dropped.
func (g *guard) say(format string, args ...any) {
	select {
	case g.notes <- fmt.Sprintf("baton guard[%d]: command %d: %s\n", os.Getpid(), g.pid, fmt.Sprintf(format, args...)):
	default:
	}
}

// printer writes the notes of say to stderr.
func (g *guard) printer() {
	for n := range g.notes {
		_, _ = os.Stderr.WriteString(n)
	}
}

// stop sends SIGTERM to the command and its descendants once and schedules
// the SIGKILL: after the grace, and KillLead before the deadline at the
// latest.
func (g *guard) stop(reason int64) {
	if g.stopping {
		return
	}
	g.stopping = true
	if reason != 0 {
		g.send(encode(msgReason, reason))
	}
	now := monotonicNow()
	g.killAt = now + g.grace
	if g.deadline != 0 {
		g.killAt = min(g.killAt, g.deadline-int64(KillLead))
	}
	g.killAt = max(g.killAt, 1)
	if !g.reaped {
		// The command's group at once, and what left the group but not
		// the command's cgroup (a short file). What left both is found by
		// a scan of the whole process table, tens of milliseconds of CPU
		// on a loaded host and needed only when something outlives the
		// group: it runs escapeScanDelay later, beside the loop, which
		// meanwhile reaps the command and, if that was all, exits first.
		// SIGKILL, if it comes to that, scans in the loop, and again until
		// nothing is left.
		_ = syscall.Kill(-g.pid, syscall.SIGTERM)
		var sent []int
		if g.cg != nil {
			sent = signalOutsideGroup(g.cg.pids(), g.pid, syscall.SIGTERM)
		}
		time.AfterFunc(escapeScanDelay, func() { signalEscaped(g.pid, syscall.SIGTERM, sent) })
		return
	}
	g.signalTree(syscall.SIGTERM)
}

// escapeScanDelay is how long after a stop the guard scans the process
// table for descendants that left the command's group and cgroup.
const escapeScanDelay = 50 * time.Millisecond

// signalOutsideGroup sends sig to each of pids outside process group pgid,
// and returns those it sent it to.
func signalOutsideGroup(pids []int, pgid int, sig syscall.Signal) []int {
	var sent []int
	for _, pid := range pids {
		if got, err := syscall.Getpgid(pid); err == nil && got != pgid {
			if syscall.Kill(pid, sig) == nil {
				sent = append(sent, pid)
			}
		}
	}
	return sent
}

// signalEscaped sends sig to every live descendant of this guard outside
// process group pgid, except those in sent (signalled already).
func signalEscaped(pgid int, sig syscall.Signal, sent []int) {
	for _, d := range proctree.Descendants(os.Getpid()) {
		if d.PGID != pgid && !slices.Contains(sent, d.PID) {
			_ = syscall.Kill(d.PID, sig)
		}
	}
}

// kill sends SIGKILL to everything below the guard.
func (g *guard) kill() {
	g.stopping, g.killing, g.killAt = true, true, 0
	if g.cg != nil {
		g.cg.kill()
	}
	g.killTree()
}

func (g *guard) killTree() {
	g.signalTree(syscall.SIGKILL)
}

// signalGroup sends sig to the command's process group, and to the command
// itself if it left the group. Not to a command still in its group twice:
// some programs take a second SIGTERM or SIGINT as "abort shutdown now".
func (g *guard) signalGroup(sig syscall.Signal) {
	if g.reaped {
		if g.groupAlive(proctree.Descendants(os.Getpid())) {
			_ = syscall.Kill(-g.pid, sig)
		}
		return
	}
	_ = syscall.Kill(-g.pid, sig)
	if pgid, err := syscall.Getpgid(g.pid); err == nil && pgid != g.pid {
		_ = syscall.Kill(g.pid, sig)
	}
}

// signalTree sends sig to the command's process group and to every other
// live descendant of the guard.
func (g *guard) signalTree(sig syscall.Signal) {
	if !g.reaped {
		// The group first, before the scan of the process table: the
		// command starts to stop while the scan runs.
		_ = syscall.Kill(-g.pid, sig)
	}
	ds := proctree.Descendants(os.Getpid())
	if g.reaped && g.groupAlive(ds) {
		_ = syscall.Kill(-g.pid, sig)
	}
	for _, d := range ds {
		if d.PGID != g.pid {
			_ = syscall.Kill(d.PID, sig)
		}
	}
}

// exitCode follows the shell convention (128+N for death by signal N) so that
// `baton run` can pass the command's status through as its own.
func exitCode(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
