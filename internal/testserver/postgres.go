package testserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
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

// PostgresBin is where Debian's postgresql-15 package installs the server's
// programs (initdb, postgres, psql); the BATON_POSTGRES_BIN environment
// variable overrides it.
const PostgresBin = "/usr/lib/postgresql/15/bin"

// ErrPostgresMissing is wrapped by the errors of NewPostgres and NewPgBouncer
// when the programs are not installed, as opposed to a server that is
// installed but fails to start. Callers hand the former to Unavailable.
var ErrPostgresMissing = errors.New("PostgreSQL or PgBouncer is not installed")

// postgresStartTimeout bounds initdb plus the server's start on a loaded CI
// machine.
const postgresStartTimeout = 60 * time.Second

// nobody is the user the servers run as when the test runs as root:
// initdb and postgres refuse to run as root, and so does pgbouncer.
const nobodyUID, nobodyGID = 65534, 65534

func init() {
	hints["postgres"] = "testserver.StartPostgres runs Debian's PostgreSQL 15 (initdb, postgres) from " + PostgresBin +
		": apt-get install postgresql-15 (or set BATON_POSTGRES_BIN)"
	hints["pgbouncer"] = "testserver.StartPgBouncer runs Debian's pgbouncer: apt-get install pgbouncer"
}

func postgresBin(name string) (string, error) {
	dir := os.Getenv("BATON_POSTGRES_BIN")
	if dir == "" {
		dir = PostgresBin
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%w: %s: %w", ErrPostgresMissing, p, err)
	}
	return p, nil
}

// Postgres is a throw-away PostgreSQL cluster: initdb in a temporary
// directory, the server listening on 127.0.0.1 and a port picked by
// net.Listen, no Unix socket, SCRAM password authentication for the
// superuser "postgres" with a random password, pg_stat_statements loaded
// (CREATE EXTENSION pg_stat_statements in a database to count statements),
// fsync off. When the test runs as root
// the cluster runs as nobody. Its methods are safe for concurrent use.
type Postgres struct {
	dir      string
	port     int
	password string
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *SyncBuffer
	once     sync.Once
}

// NewPostgres creates a cluster in dir (which must exist and be empty or
// absent below it) and starts it. The caller must Close it. It needs no
// testing.TB, so a TestMain may use it.
func NewPostgres(dir string) (*Postgres, error) {
	initdb, err := postgresBin("initdb")
	if err != nil {
		return nil, err
	}
	server, err := postgresBin("postgres")
	if err != nil {
		return nil, err
	}
	p := &Postgres{dir: dir, password: randomHex(16), exited: make(chan struct{}), log: &SyncBuffer{}}
	data := filepath.Join(dir, "data")
	pwfile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwfile, []byte(p.password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := shareDir(dir); err != nil {
		return nil, err
	}
	if err := chownNobody(pwfile); err != nil {
		return nil, err
	}
	cmd := exec.Command(initdb, "-D", data, "-U", "postgres", "--pwfile", pwfile, "--auth", "scram-sha-256",
		"--encoding", "UTF8", "--locale", "C", "--no-sync")
	cmd.SysProcAttr = unprivileged()
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	_ = os.Remove(pwfile)
	// A port from net.Listen may be taken again before the server binds
	// it: try a few.
	for try := 0; ; try++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		p.port = port
		p.cmd = exec.Command(server, "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(port), "-k", "",
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=300", "-c", "log_min_messages=warning",
			// Tests count the statements a backend sends.
			"-c", "shared_preload_libraries=pg_stat_statements", "-c", "pg_stat_statements.track=all")
		p.cmd.SysProcAttr = unprivileged()
		p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
		if err := p.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start postgres: %w", err)
		}
		p.exited = make(chan struct{})
		go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(p.cmd, p.exited)
		err = p.waitReady()
		if err == nil {
			return p, nil
		}
		p.stop()
		if try == 2 || !strings.Contains(p.log.String(), "could not bind") {
			return nil, fmt.Errorf("postgres did not start: %w\n%s", err, p.log.String())
		}
	}
}

// Addr returns the server's host:port.
func (p *Postgres) Addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

// Port returns the server's port.
func (p *Postgres) Port() int { return p.port }

// Password returns the superuser's password, for tests that check it never
// shows in logs or errors.
func (p *Postgres) Password() string { return p.password }

// URL returns the superuser's connection string to database db.
func (p *Postgres) URL(db string) string {
	return p.urlAt(p.Addr(), "postgres", p.password, db)
}

func (p *Postgres) urlAt(addr, user, password, db string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: addr, Path: "/" + db, RawQuery: "sslmode=disable"}
	return u.String()
}

// Log returns what the server wrote so far.
func (p *Postgres) Log() string { return p.log.String() }

// SQL runs sql through psql as the superuser in database db and returns
// its unaligned, tuples-only output. Statements run in one session.
func (p *Postgres) SQL(db, sql string) (string, error) {
	psql, err := postgresBin("psql")
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), postgresStartTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
		"-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres", "-d", db, "-c", sql)
	cmd.Env = append(os.Environ(), "PGPASSWORD="+p.password, "PGCONNECT_TIMEOUT=10")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("psql %q: %w: %s", sql, err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// NewDatabase creates a database of its own for the test, dropped at the
// test's end, and returns its superuser URL.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	name := "t_" + randomHex(8)
	if _, err := p.SQL("postgres", "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		_, _ = p.SQL("postgres", "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return p.URL(name)
}

// NewRole creates a login role with a random password (no privileges beyond
// LOGIN) and returns its name and password.
func (p *Postgres) NewRole(t testing.TB) (name, password string) {
	t.Helper()
	name, password = "r_"+randomHex(6), randomHex(16)
	if _, err := p.SQL("postgres", fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", name, password)); err != nil {
		t.Fatalf("create role: %v", err)
	}
	return name, password
}

// URLAs returns the connection string of role user with password to
// database db.
func (p *Postgres) URLAs(user, password, db string) string {
	return p.urlAt(p.Addr(), user, password, db)
}

// Close stops the server (fast shutdown) and removes its directory.
func (p *Postgres) Close() {
	p.once.Do(func() {
		p.stop()
		_ = os.RemoveAll(p.dir)
	})
}

func (p *Postgres) stop() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT) // fast shutdown: roll back and disconnect
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// StartPostgres starts a cluster for t alone in a fresh t.TempDir and
// closes it when the test ends, showing its log if the test failed: for
// tests that stop, wipe or replace the server. Missing programs go through
// Unavailable (skip, or fail under BATON_REQUIRE_SERVERS=1); an installed
// server that fails to start fails the test.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	p, err := NewPostgres(t.TempDir())
	if err != nil {
		if errors.Is(err, ErrPostgresMissing) {
			Unavailable(t, "postgres", err)
		}
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("postgres log:\n%s", p.Log())
		}
	})
	t.Cleanup(p.Close)
	return p
}

var sharedPostgres sharedServer[*Postgres]

// SharedPostgres returns the cluster shared by every test of the test
// binary, starting it on first use (initdb costs a second or two); each
// test takes a database of its own with NewDatabase. A test package that
// uses it must call StopSharedPostgres from TestMain after m.Run. Missing
// programs go through Unavailable, as for StartPostgres.
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	return sharedPostgres.get(t, "postgres", NewPostgres, missing(ErrPostgresMissing))
}

// StopSharedPostgres stops the cluster SharedPostgres started, if any, and
// removes its directory.
func StopSharedPostgres() { sharedPostgres.stop() }

// Restart stops the server and starts it again on the same port and data
// directory; with wipe, the data directory is made afresh first (a server
// that lost all its data, behind the same address).
func (p *Postgres) Restart(wipe bool) error {
	p.stop()
	data := filepath.Join(p.dir, "data")
	if wipe {
		if err := os.RemoveAll(data); err != nil {
			return err
		}
		pwfile := filepath.Join(p.dir, "pwfile")
		if err := os.WriteFile(pwfile, []byte(p.password+"\n"), 0o600); err != nil {
			return err
		}
		if err := chownNobody(pwfile); err != nil {
			return err
		}
		initdb, err := postgresBin("initdb")
		if err != nil {
			return err
		}
		cmd := exec.Command(initdb, "-D", data, "-U", "postgres", "--pwfile", pwfile, "--auth", "scram-sha-256",
			"--encoding", "UTF8", "--locale", "C", "--no-sync")
		cmd.SysProcAttr = unprivileged()
		cmd.Dir = p.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("initdb: %w\n%s", err, out)
		}
		_ = os.Remove(pwfile)
	}
	args := p.cmd.Args[1:]
	p.cmd = exec.Command(p.cmd.Path, args...)
	p.cmd.SysProcAttr = unprivileged()
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(p.cmd, p.exited)
	return p.waitReady()
}

// waitReady waits until the server answers a query (it accepts
// connections before it accepts queries, while it starts up).
func (p *Postgres) waitReady() error {
	if err := waitListening(p.Addr(), p.exited, postgresStartTimeout); err != nil {
		return err
	}
	deadline := time.Now().Add(postgresStartTimeout)
	for {
		_, err := p.SQL("postgres", "SELECT 1")
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return errors.New("postgres exited")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return err
		}
	}
}

// PgBouncer is a PgBouncer in front of a Postgres, in transaction-pooling
// mode (pool_mode = transaction), on 127.0.0.1 and a port picked by
// net.Listen, authenticating clients with SCRAM against the same superuser
// password. When the test runs as root it runs as nobody.
type PgBouncer struct {
	pg     *Postgres
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
	log    *SyncBuffer
	once   sync.Once
}

// NewPgBouncer starts a PgBouncer in front of pg, with its files in dir.
// The caller must Close it.
func NewPgBouncer(pg *Postgres, dir string) (*PgBouncer, error) {
	bin, err := pgbouncerBin()
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{pg: pg, dir: dir, log: &SyncBuffer{}}
	if err := shareDir(dir); err != nil {
		return nil, err
	}
	users := filepath.Join(dir, "userlist.txt")
	if err := os.WriteFile(users, []byte(fmt.Sprintf("%q %q\n", "postgres", pg.password)), 0o600); err != nil {
		return nil, err
	}
	if err := chownNobody(users); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		b.port = port
		ini := filepath.Join(dir, "pgbouncer.ini")
		conf := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,statement_timeout,idle_in_transaction_session_timeout
`, pg.port, port, users)
		if err := os.WriteFile(ini, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		b.cmd = exec.Command(bin, ini)
		b.cmd.SysProcAttr = unprivileged()
		b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
		if err := b.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start pgbouncer: %w", err)
		}
		b.exited = make(chan struct{})
		go func(cmd *exec.Cmd, exited chan struct{}) { _ = cmd.Wait(); close(exited) }(b.cmd, b.exited)
		err = waitListening(b.Addr(), b.exited, postgresStartTimeout)
		if err == nil {
			return b, nil
		}
		b.stop()
		if try == 2 || !strings.Contains(b.log.String(), "bind") {
			return nil, fmt.Errorf("pgbouncer did not start: %w\n%s", err, b.log.String())
		}
	}
}

// pgbouncerDebian is where Debian's pgbouncer package installs the program:
// an sbin directory, which is on root's PATH but not on a plain user's.
const pgbouncerDebian = "/usr/sbin/pgbouncer"

// pgbouncerBin finds pgbouncer on PATH, else where Debian installs it, so
// that a test run by a plain user finds the same program as one run by root.
func pgbouncerBin() (string, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err == nil {
		return bin, nil
	}
	if _, serr := os.Stat(pgbouncerDebian); serr == nil {
		return pgbouncerDebian, nil
	}
	return "", fmt.Errorf("%w: %w (nor at %s)", ErrPostgresMissing, err, pgbouncerDebian)
}

// StartPgBouncer starts a PgBouncer in front of pg for t, closed at t's end.
func StartPgBouncer(t testing.TB, pg *Postgres) *PgBouncer {
	t.Helper()
	b, err := NewPgBouncer(pg, t.TempDir())
	if err != nil {
		if errors.Is(err, ErrPostgresMissing) {
			Unavailable(t, "pgbouncer", err)
		}
		t.Fatalf("start pgbouncer: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

// Addr returns PgBouncer's host:port.
func (b *PgBouncer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// URL returns the superuser's connection string to database db through
// PgBouncer.
func (b *PgBouncer) URL(db string) string {
	return b.pg.urlAt(b.Addr(), "postgres", b.pg.password, db)
}

// Via returns url (one of the Postgres's URLs) with its host and port
// replaced by PgBouncer's.
func (b *PgBouncer) Via(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	u.Host = b.Addr()
	return u.String()
}

// Log returns what PgBouncer wrote so far.
func (b *PgBouncer) Log() string { return b.log.String() }

// Close stops PgBouncer.
func (b *PgBouncer) Close() { b.once.Do(b.stop) }

func (b *PgBouncer) stop() {
	if b.cmd == nil || b.cmd.Process == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

// missing returns the unavailable function of sharedServer.get: errors
// wrapping sentinel are reasons to skip.
func missing(sentinel error) func(error) error {
	return func(err error) error {
		if errors.Is(err, sentinel) {
			return err
		}
		return nil
	}
}

// unprivileged returns the process attributes that run a server as nobody
// when the test runs as root, and nil otherwise.
func unprivileged() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		attr.Credential = &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID, Groups: []uint32{}}
	}
	return attr
}

// shareDir makes dir, and the directories above it, searchable by nobody,
// and dir itself owned by nobody, when the test runs as root.
func shareDir(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := os.Chown(abs, nobodyUID, nobodyGID); err != nil {
		return err
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return err
	}
	for p := filepath.Dir(abs); p != filepath.Dir(p); p = filepath.Dir(p) {
		st, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(p, st.Mode().Perm()|0o001); err != nil {
				return err
			}
		}
	}
	return nil
}

func chownNobody(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Chown(path, nobodyUID, nobodyGID)
}

// waitListening waits until addr accepts TCP connections, the process
// exits (exited closes), or timeout passes.
func waitListening(addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-exited:
			return errors.New("the process exited")
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %s", addr, timeout)
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
