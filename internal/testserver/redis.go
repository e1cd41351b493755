package testserver

import (
	"bufio"
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

// RedisServerBin and RedisSentinelBin are Debian's redis-server and
// redis-sentinel programs, found on PATH; the BATON_REDIS_SERVER and
// BATON_REDIS_SENTINEL environment variables override them.
const (
	RedisServerBin   = "redis-server"
	RedisSentinelBin = "redis-sentinel"
)

// ErrRedisMissing is wrapped by the errors of NewRedis and NewSentinels when
// the programs are not installed, as opposed to a server that is installed
// but fails to start.
var ErrRedisMissing = errors.New("redis-server or redis-sentinel is not installed")

// redisStartTimeout bounds a server's start on a loaded CI machine.
const redisStartTimeout = 30 * time.Second

func init() {
	hints["redis"] = "testserver.StartRedis runs Debian's redis-server (and StartSentinels its redis-sentinel): " +
		"apt-get install redis-server redis-sentinel (no system service is needed: stop it), " +
		"or set BATON_REDIS_SERVER / BATON_REDIS_SENTINEL"
}

func redisBin(env, name string) (string, error) {
	if p := os.Getenv(env); p != "" {
		name = p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrRedisMissing, err)
	}
	return p, nil
}

// RedisOptions configures a Redis server. The zero value is a server with
// no password, no persistence and no replication.
type RedisOptions struct {
	// Password, if set, is the default user's password (requirepass).
	Password string
	// Config holds more configuration directives, one per line as in
	// redis.conf ("appendonly yes", "user alice on >pw ~* +@all").
	Config []string
	// ReplicaOf, if set, is the primary's address: the server starts as
	// its replica.
	ReplicaOf string
}

// Redis is a throw-away redis-server listening on 127.0.0.1 and a port
// picked by net.Listen, with its files in a temporary directory. Its
// methods are safe for concurrent use.
type Redis struct {
	dir      string
	port     int
	password string
	bin      string
	conf     string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	log    *SyncBuffer
	closed bool
}

// StartRedis starts a server, skipping (or failing, under
// BATON_REQUIRE_SERVERS=1) the test when redis-server is missing; it stops
// when the test ends.
func StartRedis(t testing.TB, o RedisOptions) *Redis {
	t.Helper()
	r, err := NewRedis(t.TempDir(), o)
	if errors.Is(err, ErrRedisMissing) {
		Unavailable(t, "redis", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// NewRedis starts a server with its files in dir. The caller must Close it.
func NewRedis(dir string, o RedisOptions) (*Redis, error) {
	bin, err := redisBin("BATON_REDIS_SERVER", RedisServerBin)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	lines := []string{
		"bind 127.0.0.1",
		"port " + strconv.Itoa(port),
		"dir " + dir,
		`save ""`,
		"appendonly no",
		"daemonize no",
		"protected-mode no",
		"logfile \"\"",
		// A replica that lost its link answers with what it has: the
		// failover tests promote it.
		"replica-serve-stale-data yes",
	}
	if o.Password != "" {
		lines = append(lines, "requirepass "+o.Password, "masterauth "+o.Password)
	}
	if o.ReplicaOf != "" {
		h, p, _ := net.SplitHostPort(o.ReplicaOf)
		lines = append(lines, "replicaof "+h+" "+p)
	}
	lines = append(lines, o.Config...)
	conf := filepath.Join(dir, "redis.conf")
	if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	r := &Redis{dir: dir, port: port, password: o.Password, bin: bin, conf: conf}
	if err := r.start(); err != nil {
		return nil, err
	}
	return r, nil
}

// start runs the server on its configuration file and waits until it
// answers PING.
func (r *Redis) start() error {
	log := new(SyncBuffer)
	cmd := exec.Command(r.bin, r.conf)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", r.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	r.mu.Lock()
	r.cmd, r.exited, r.log = cmd, exited, log
	r.mu.Unlock()
	deadline := time.Now().Add(redisStartTimeout)
	for {
		_, err := r.Do("PING")
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited while starting: %v\n%s", r.bin, err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("%s did not answer PING within %s: %v\n%s", r.bin, redisStartTimeout, err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr returns the server's address, 127.0.0.1:PORT.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Password returns the default user's password, or "".
func (r *Redis) Password() string { return r.password }

// URL returns a redis:// URL of database db on the server.
func (r *Redis) URL(db int) string {
	auth := ""
	if r.password != "" {
		auth = ":" + r.password + "@"
	}
	return fmt.Sprintf("redis://%s%s/%d", auth, r.Addr(), db)
}

// Log returns what the server logged so far.
func (r *Redis) Log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.String()
}

// Pid returns the server process's id.
func (r *Redis) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Pid
}

// Signal sends sig to the server: SIGSTOP pauses it (its clients and
// replicas see it hang), SIGCONT resumes it.
func (r *Redis) Signal(sig syscall.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Signal(sig)
}

// Kill kills the server with SIGKILL and waits for it to exit: what it had
// not written to disk is lost.
func (r *Redis) Kill() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Kill()
	<-exited
}

// Start starts a server that Kill stopped again, on the same port,
// configuration and directory, and returns once it answers PING.
func (r *Redis) Start() error { return r.start() }

// Dir returns the server's directory (its configuration, RDB and AOF files).
func (r *Redis) Dir() string { return r.dir }

// Restart kills the server (SIGKILL) and starts it again on the same port
// and configuration.
func (r *Redis) Restart() error {
	r.Kill()
	return r.start()
}

// Close kills the server and waits for it to exit.
func (r *Redis) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	r.Kill()
}

// Do sends one command to the server on a connection of its own (AUTH
// first when the server has a password) and returns its reply: a string,
// an int64, nil, or a []any of those; an error reply is returned as an
// error.
func (r *Redis) Do(args ...string) (any, error) {
	c, err := net.DialTimeout("tcp", r.Addr(), 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	rd := bufio.NewReader(c)
	if r.password != "" {
		if _, err := roundTrip(c, rd, "AUTH", r.password); err != nil {
			return nil, err
		}
	}
	return roundTrip(c, rd, args...)
}

// MustDo is Do that fails the test on an error.
func (r *Redis) MustDo(t testing.TB, args ...string) any {
	t.Helper()
	v, err := r.Do(args...)
	if err != nil {
		t.Fatalf("redis %s: %v", strings.Join(args, " "), err)
	}
	return v
}

// RedisError is an error reply from a Redis server.
type RedisError struct{ Msg string }

// Error returns the server's message.
func (e *RedisError) Error() string { return e.Msg }

func roundTrip(c net.Conn, rd *bufio.Reader, args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	return readReply(rd)
}

func readReply(rd *bufio.Reader) (any, error) {
	line, err := rd.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return nil, errors.New("redis: empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, &RedisError{Msg: line[1:]}
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := ioReadFull(rd, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(rd); err != nil {
				var re *RedisError
				if !errors.As(err, &re) {
					return nil, err
				}
				out[i] = err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("redis: unexpected reply %q", line)
}

func ioReadFull(rd *bufio.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := rd.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// Sentinels are redis-sentinel processes watching one primary under one
// master name, on loopback: a Sentinel group as go-redis's failover
// client takes it.
type Sentinels struct {
	// MasterName is the name the sentinels monitor the primary under.
	MasterName string
	// Procs are the sentinels.
	Procs []*Redis
}

// SentinelOptions configures StartSentinels.
type SentinelOptions struct {
	// N is the number of sentinels; zero means 3.
	N int
	// Quorum is how many sentinels must agree that the primary is down;
	// zero means a majority of N.
	Quorum int
	// DownAfter is how long the primary must not answer for a sentinel to
	// think it down; zero means 1 s.
	DownAfter time.Duration
}

// StartSentinels starts sentinels monitoring primary as "mymaster", with
// a failover timeout short enough for tests; they stop when the test ends.
func StartSentinels(t testing.TB, primary *Redis, o SentinelOptions) *Sentinels {
	t.Helper()
	s, err := NewSentinels(t.TempDir(), primary, o)
	if errors.Is(err, ErrRedisMissing) {
		Unavailable(t, "redis", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// NewSentinels starts sentinels as StartSentinels does, each with its
// files in a directory of its own under dir. The caller must Close them.
func NewSentinels(dir string, primary *Redis, o SentinelOptions) (*Sentinels, error) {
	if o.N == 0 {
		o.N = 3
	}
	if o.Quorum == 0 {
		o.Quorum = o.N/2 + 1
	}
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	bin, err := redisBin("BATON_REDIS_SENTINEL", RedisSentinelBin)
	if err != nil {
		return nil, err
	}
	s := &Sentinels{MasterName: "mymaster"}
	h, p, _ := net.SplitHostPort(primary.Addr())
	for i := range o.N {
		dir := filepath.Join(dir, fmt.Sprintf("sentinel-%d", i+1))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			s.Close()
			return nil, err
		}
		port, err := freePort()
		if err != nil {
			s.Close()
			return nil, err
		}
		lines := []string{
			"bind 127.0.0.1",
			"port " + strconv.Itoa(port),
			"dir " + dir,
			"daemonize no",
			"protected-mode no",
			"logfile \"\"",
			"sentinel announce-ip 127.0.0.1",
			fmt.Sprintf("sentinel monitor %s %s %s %d", s.MasterName, h, p, o.Quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", s.MasterName, o.DownAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s 10000", s.MasterName),
			fmt.Sprintf("sentinel parallel-syncs %s 1", s.MasterName),
		}
		if primary.password != "" {
			lines = append(lines, fmt.Sprintf("sentinel auth-pass %s %s", s.MasterName, primary.password))
		}
		conf := filepath.Join(dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			s.Close()
			return nil, err
		}
		r := &Redis{dir: dir, port: port, bin: bin, conf: conf}
		if err := r.start(); err != nil {
			s.Close()
			return nil, err
		}
		s.Procs = append(s.Procs, r)
	}
	return s, nil
}

// Close stops the sentinels.
func (s *Sentinels) Close() {
	for _, r := range s.Procs {
		r.Close()
	}
}

// Addrs returns the sentinels' addresses.
func (s *Sentinels) Addrs() []string {
	var out []string
	for _, r := range s.Procs {
		out = append(out, r.Addr())
	}
	return out
}

// Primary asks the first sentinel that answers for the primary's address.
func (s *Sentinels) Primary() (string, error) {
	var last error
	for _, r := range s.Procs {
		v, err := r.Do("SENTINEL", "get-master-addr-by-name", s.MasterName)
		if err != nil {
			last = err
			continue
		}
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			last = fmt.Errorf("sentinel %s: unexpected reply %v", r.Addr(), v)
			continue
		}
		return net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1])), nil
	}
	return "", last
}
