package testserver

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
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

	"github.com/batonhq/baton/internal/certs"
)

// ZooKeeper timing. A short tick lets sessions as short as one second be
// granted as asked: ZooKeeper raises any timeout below minSessionTimeout
// (by default two ticks) without an error, and expires sessions on tick
// boundaries.
const (
	// ZooKeeperTick is the server's tickTime.
	ZooKeeperTick = 500 * time.Millisecond
	// ZooKeeperMinSessionTimeout is the server's minSessionTimeout.
	ZooKeeperMinSessionTimeout = time.Second
	// ZooKeeperMaxSessionTimeout is the server's maxSessionTimeout (60
	// ticks; the default is 20): the conformance suite asks for a TTL of
	// 20 s. A client that asks for more is granted this.
	ZooKeeperMaxSessionTimeout = 60 * ZooKeeperTick
	// ZooKeeperContainerCheck is how often the server deletes container
	// nodes whose last child is gone (znode.container.checkIntervalMs;
	// one minute by default), short so that tests meet the deletion.
	ZooKeeperContainerCheck = time.Second
)

// zooKeeperStartTimeout bounds a server's start, JVM start-up included,
// which takes seconds on a loaded two-core CI machine.
const zooKeeperStartTimeout = 60 * time.Second

// JavaDir is where Debian installs Java libraries (packages zookeeper,
// libcurator-recipes-java): the ZooKeeper server and its dependencies, named
// in the Class-Path of zookeeper.jar's manifest, live there.
const JavaDir = "/usr/share/java"

// ErrJavaMissing is wrapped by the errors of NewZooKeeper and JavaClassPath
// when java, javac or a jar is not installed, as opposed to a server that
// is installed but fails to start. Callers hand the former to Unavailable.
var ErrJavaMissing = errors.New("java or a java library is not installed")

// ZooKeeperOptions configures NewZooKeeper. The zero value starts a plain
// server.
type ZooKeeperOptions struct {
	// TLS adds a secureClientPort served with a certificate from a fresh CA,
	// and requiring client certificates from it; see TLSAddr and ClientTLS.
	TLS bool
}

// ZooKeeper is a standalone Apache ZooKeeper server (the Debian package's
// jars, run with java) listening on 127.0.0.1 only, with tickTime 500 ms,
// minSessionTimeout 1 s, and empty container nodes deleted every second.
// Its methods are safe for concurrent use.
type ZooKeeper struct {
	cmd     *exec.Cmd
	addr    string
	tlsAddr string
	tlsCfg  *tls.Config
	log     *SyncBuffer
	exited  chan struct{} // closed when the JVM has exited
	waitErr error         // the JVM's exit status; read after exited
	once    sync.Once
}

// JavaClassPath returns the jars named, found in JavaDir, joined into a
// class path, or an error wrapping ErrJavaMissing naming the first that is
// missing. Jars name their own dependencies in their manifests' Class-Path,
// which java and javac follow.
func JavaClassPath(jars ...string) (string, error) {
	paths := make([]string, len(jars))
	for i, jar := range jars {
		paths[i] = filepath.Join(JavaDir, jar)
		if _, err := os.Stat(paths[i]); err != nil {
			return "", fmt.Errorf("%w: %v", ErrJavaMissing, err)
		}
	}
	return strings.Join(paths, string(os.PathListSeparator)), nil
}

// JavaTool returns the path of a JDK program ("java", "javac"), or an error
// wrapping ErrJavaMissing.
func JavaTool(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrJavaMissing, err)
	}
	return path, nil
}

// JavaQuickStart are JVM options for short-lived test processes: they trade
// peak speed for start-up time and memory on a small CI machine.
var JavaQuickStart = []string{"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k", "-Xmx256m"}

// NewZooKeeper starts a server keeping its data and configuration in dir,
// for callers without a testing.TB (see SharedZooKeeper). It returns once
// the server answers the srvr command with "Mode: standalone". The caller
// must Close it. An error wrapping ErrJavaMissing means java or the
// ZooKeeper jars are not installed.
func NewZooKeeper(dir string, opts ZooKeeperOptions) (*ZooKeeper, error) {
	java, err := JavaTool("java")
	if err != nil {
		return nil, err
	}
	// slf4j-simple to stderr, at warn, replaces the Debian log4j set-up,
	// which writes to /var/log.
	jars := []string{"zookeeper.jar", "slf4j-simple.jar"}
	if opts.TLS {
		// Debian's zookeeper.jar names netty's buffer, transport and
		// handler in its Class-Path but not netty-codec, which the Netty
		// connection factory needs.
		jars = append(jars, "netty-codec.jar", "netty-resolver.jar")
	}
	cp, err := JavaClassPath(jars...)
	if err != nil {
		return nil, err
	}
	// The free port may be taken between our probe and the JVM's bind;
	// that shows as an early exit, and another port will do.
	var lastErr error
	for range 3 {
		z, err := startZooKeeper(java, cp, dir, opts)
		if err == nil {
			return z, nil
		}
		lastErr = err
		var exit *earlyExitError
		if !errors.As(err, &exit) || !strings.Contains(exit.log, "BindException") {
			break
		}
	}
	return nil, lastErr
}

type earlyExitError struct {
	err error
	log string
}

func (e *earlyExitError) Error() string {
	return fmt.Sprintf("zookeeper exited during start-up (%v); its log:\n%s", e.err, e.log)
}

func startZooKeeper(java, cp, dir string, opts ZooKeeperOptions) (*ZooKeeper, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	cfg := []string{
		"tickTime=" + strconv.Itoa(int(ZooKeeperTick/time.Millisecond)),
		"minSessionTimeout=" + strconv.Itoa(int(ZooKeeperMinSessionTimeout/time.Millisecond)),
		"maxSessionTimeout=" + strconv.Itoa(int(ZooKeeperMaxSessionTimeout/time.Millisecond)),
		"dataDir=" + data,
		"clientPortAddress=127.0.0.1",
		"clientPort=" + strconv.Itoa(port),
		// Every test client connects from 127.0.0.1, through proxies:
		// the default cap of 60 connections per address is too few.
		"maxClientCnxns=0",
		"admin.enableServer=false",
		"4lw.commands.whitelist=srvr,ruok,cons,stat,mntr,wchp",
		// The data dies with the test; fsync per transaction would only
		// slow a CI disk down.
		"forceSync=no",
	}
	jvm := append([]string{}, JavaQuickStart...)
	z := &ZooKeeper{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: new(SyncBuffer), exited: make(chan struct{})}
	if opts.TLS {
		tlsPort, err := freePort()
		if err != nil {
			return nil, err
		}
		keyStore, trustStore, clientCfg, err := zooKeeperTLSMaterial(dir)
		if err != nil {
			return nil, err
		}
		z.tlsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
		z.tlsCfg = clientCfg
		cfg = append(cfg,
			"secureClientPortAddress=127.0.0.1",
			"secureClientPort="+strconv.Itoa(tlsPort),
			"ssl.keyStore.location="+keyStore,
			"ssl.keyStore.type=PEM",
			"ssl.trustStore.location="+trustStore,
			"ssl.trustStore.type=PEM",
			"ssl.clientAuth=need",
		)
		// Only the Netty connection factory speaks TLS.
		jvm = append(jvm, "-Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory")
	}
	cfgFile := filepath.Join(dir, "zoo.cfg")
	if err := os.WriteFile(cfgFile, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
		return nil, err
	}
	args := append(jvm,
		"-Dznode.container.checkIntervalMs="+strconv.Itoa(int(ZooKeeperContainerCheck/time.Millisecond)),
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		"-Dzookeeper.jmx.log4j.disable=true",
		"-cp", cp,
		"org.apache.zookeeper.server.ZooKeeperServerMain", cfgFile)
	cmd := exec.Command(java, args...)
	cmd.Dir = dir
	cmd.Stdout = z.log
	cmd.Stderr = z.log
	// Should the test binary die without its clean-up (a panic, a timeout),
	// the kernel kills the server rather than leaving it running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start zookeeper: %w", err)
	}
	z.cmd = cmd
	go func() {
		z.waitErr = cmd.Wait()
		close(z.exited)
	}()
	if err := z.awaitStandalone(zooKeeperStartTimeout); err != nil {
		z.Close()
		return nil, err
	}
	return z, nil
}

// awaitStandalone polls srvr until the server says it serves standalone.
func (z *ZooKeeper) awaitStandalone(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		out, err := z.FourLetter("srvr")
		if err == nil && strings.Contains(out, "Mode: standalone") {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("srvr answered %q", out)
		}
		last = err
		select {
		case <-z.exited:
			return &earlyExitError{err: z.waitErr, log: z.log.String()}
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zookeeper not ready within %s: %v; its log:\n%s", timeout, last, z.log)
		}
	}
}

// FourLetter sends a four-letter-word command (srvr, ruok, cons, stat,
// mntr and wchp are enabled) to the plain client port and returns the
// answer.
func (z *ZooKeeper) FourLetter(cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", z.addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	out, err := io.ReadAll(bufio.NewReader(c))
	return string(out), err
}

// Addr returns the plain client address, "127.0.0.1:PORT".
func (z *ZooKeeper) Addr() string { return z.addr }

// TLSAddr returns the TLS client address (the secureClientPort), or "" when
// the server was started without TLS.
func (z *ZooKeeper) TLSAddr() string { return z.tlsAddr }

// ClientTLS returns a client configuration for TLSAddr: it trusts the
// server's CA and presents a client certificate from it. Nil without TLS.
// Each call returns a fresh clone.
func (z *ZooKeeper) ClientTLS() *tls.Config {
	if z.tlsCfg == nil {
		return nil
	}
	return z.tlsCfg.Clone()
}

// Log returns what the server has logged so far (warnings and errors).
func (z *ZooKeeper) Log() string { return z.log.String() }

// Close kills the server and waits for it to exit. Calling it again is
// harmless.
func (z *ZooKeeper) Close() {
	z.once.Do(func() {
		_ = z.cmd.Process.Kill()
		<-z.exited
	})
}

// StartZooKeeper starts a server in a fresh t.TempDir and closes it when the
// test ends; the server's log is shown if the test fails. Missing java or
// ZooKeeper jars go through Unavailable (skip, or fail under
// BATON_REQUIRE_SERVERS=1); an installed server that fails to start fails
// the test.
func StartZooKeeper(t testing.TB, opts ZooKeeperOptions) *ZooKeeper {
	t.Helper()
	z, err := NewZooKeeper(t.TempDir(), opts)
	if errors.Is(err, ErrJavaMissing) {
		Unavailable(t, "zookeeper", err)
	}
	if err != nil {
		t.Fatalf("start zookeeper: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() && z.log.Len() > 0 {
			t.Logf("zookeeper log:\n%s", z.log)
		}
	})
	t.Cleanup(z.Close)
	return z
}

var sharedZooKeeper sharedServer[*ZooKeeper]

// SharedZooKeeper returns a plain server shared by every test of the test
// binary, starting it on first use: JVM start-up costs seconds, and tests
// that keep to paths of their own do not disturb each other. A test
// package that uses it must call StopSharedZooKeeper from TestMain after
// m.Run. Missing java goes through Unavailable, as for StartZooKeeper.
func SharedZooKeeper(t testing.TB) *ZooKeeper {
	t.Helper()
	return sharedZooKeeper.get(t, "zookeeper",
		func(dir string) (*ZooKeeper, error) { return NewZooKeeper(dir, ZooKeeperOptions{}) },
		func(err error) error {
			if errors.Is(err, ErrJavaMissing) {
				return err
			}
			return nil
		})
}

// StopSharedZooKeeper stops the server SharedZooKeeper started, if any, and
// removes its directory.
func StopSharedZooKeeper() { sharedZooKeeper.stop() }

// freePort returns a port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// zooKeeperTLSMaterial makes a CA, a server certificate for 127.0.0.1 and a
// client certificate, writes the server's PEM key store (key and
// certificate in one file, as ZooKeeper's ssl.keyStore.type=PEM wants) and
// trust store into dir, and returns their paths and the client config.
func zooKeeperTLSMaterial(dir string) (keyStore, trustStore string, client *tls.Config, err error) {
	ca, err := certs.NewCA("baton test zookeeper CA", time.Hour)
	if err != nil {
		return "", "", nil, err
	}
	srvCert, srvKey, err := ca.Issue("zookeeper", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		return "", "", nil, err
	}
	keyStore = filepath.Join(dir, "server.pem")
	trustStore = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(keyStore, append(append([]byte{}, srvKey...), srvCert...), 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(trustStore, ca.CertPEM(), 0o644); err != nil {
		return "", "", nil, err
	}
	cliCert, cliKey, err := ca.Issue("baton-client", nil, time.Hour)
	if err != nil {
		return "", "", nil, err
	}
	pair, err := tls.X509KeyPair(cliCert, cliKey)
	if err != nil {
		return "", "", nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	return keyStore, trustStore, &tls.Config{
		RootCAs:      pool,
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
	}, nil
}
