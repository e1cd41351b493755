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
	"github.com/batonhq/baton/internal/testkit"
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

// ErrJavaMissing is wrapped by the errors of NewZooKeeper,
// NewZooKeeperEnsemble and JavaClassPath when java, javac or a jar is not
// installed, as opposed to a server that is installed but fails to start.
// Callers hand the former to Unavailable.
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
	jvm     *zooKeeperJVM
	addr    string
	tlsAddr string
	tlsCfg  *tls.Config
	log     *SyncBuffer
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
//
// NewZooKeeper on the dir of a server that was closed (killed) brings back
// its znodes and the sessions that had not expired, whose clients resume
// them on reconnecting (TestZooKeeperRestartKeepsData). The server comes
// back on a new port: clients that must follow it connect through a Proxy,
// which is then Retargeted.
func NewZooKeeper(dir string, opts ZooKeeperOptions) (*ZooKeeper, error) {
	var extra []string
	if opts.TLS {
		// Debian's zookeeper.jar names netty's buffer, transport and
		// handler in its Class-Path but not netty-codec, which the Netty
		// connection factory needs.
		extra = []string{"netty-codec.jar", "netty-resolver.jar"}
	}
	java, cp, err := zooKeeperJava(extra...)
	if err != nil {
		return nil, err
	}
	return retryBindRace(func() (*ZooKeeper, error) { return startZooKeeper(java, cp, dir, opts) })
}

// zooKeeperJava returns the java program and the class path of a ZooKeeper
// server, with extra jars from JavaDir, or an error wrapping
// ErrJavaMissing.
func zooKeeperJava(extra ...string) (java, cp string, err error) {
	java, err = JavaTool("java")
	if err != nil {
		return "", "", err
	}
	// slf4j-simple to stderr, at warn, replaces the Debian log4j set-up,
	// which writes to /var/log.
	cp, err = JavaClassPath(append([]string{"zookeeper.jar", "slf4j-simple.jar"}, extra...)...)
	if err != nil {
		return "", "", err
	}
	return java, cp, nil
}

// retryBindRace runs start up to three times while it fails by losing a
// race for a port: a port found free may be taken between our probe and
// the JVM's bind, which shows as an early exit with a BindException in the
// log, and start picks other ports each time.
func retryBindRace[T any](start func() (T, error)) (T, error) {
	var (
		zero    T
		lastErr error
	)
	for range 3 {
		v, err := start()
		if err == nil {
			return v, nil
		}
		lastErr = err
		var exit *earlyExitError
		if !errors.As(err, &exit) || !strings.Contains(exit.log, "BindException") {
			break
		}
	}
	return zero, lastErr
}

// earlyExitError reports a server that exited during start-up.
type earlyExitError struct {
	who string // which server: "zookeeper" when empty
	err error
	log string
}

func (e *earlyExitError) Error() string {
	who := e.who
	if who == "" {
		who = "zookeeper"
	}
	return fmt.Sprintf("%s exited during start-up (%v); its log:\n%s", who, e.err, e.log)
}

// zooKeeperConfig returns the zoo.cfg lines that every server started here
// has, standalone or in an ensemble: the timing above, data in dataDir,
// clients served on clientHost:clientPort only (127.0.0.1 but for an
// ensemble given ZooKeeperEnsembleOptions.Hosts), and settings that suit
// tests.
func zooKeeperConfig(dataDir, clientHost string, clientPort int) []string {
	return []string{
		"tickTime=" + strconv.Itoa(int(ZooKeeperTick/time.Millisecond)),
		"minSessionTimeout=" + strconv.Itoa(int(ZooKeeperMinSessionTimeout/time.Millisecond)),
		"maxSessionTimeout=" + strconv.Itoa(int(ZooKeeperMaxSessionTimeout/time.Millisecond)),
		"dataDir=" + dataDir,
		"clientPortAddress=" + clientHost,
		"clientPort=" + strconv.Itoa(clientPort),
		// Every test client connects from 127.0.0.1, through proxies:
		// the default cap of 60 connections per address is too few.
		"maxClientCnxns=0",
		"admin.enableServer=false",
		"4lw.commands.whitelist=srvr,ruok,cons,stat,mntr,wchp",
		// Test data need not survive a crash of the machine, and fsync per
		// transaction would slow a CI disk down. Transactions are still
		// written to the kernel before they are acknowledged, so a killed
		// server restarted on its dir loses nothing.
		"forceSync=no",
	}
}

// zooKeeperJVM is one run of a ZooKeeper server's JVM.
type zooKeeperJVM struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the JVM has exited
	waitErr error         // the JVM's exit status; read after exited
}

// startZooKeeperJVM runs mainClass (ZooKeeperServerMain, or QuorumPeerMain
// for a member of an ensemble) on cfgFile, in dir, with JavaQuickStart and
// the options in jvm, logging to log. command makes the command (nil:
// exec.Command), as ZooKeeperEnsembleOptions.Command does.
func startZooKeeperJVM(command func(name string, arg ...string) *exec.Cmd, java, cp, dir, mainClass, cfgFile string, jvm []string, log io.Writer) (*zooKeeperJVM, error) {
	args := append(append(append([]string{}, JavaQuickStart...), jvm...),
		"-Dznode.container.checkIntervalMs="+strconv.Itoa(int(ZooKeeperContainerCheck/time.Millisecond)),
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		"-Dzookeeper.jmx.log4j.disable=true",
		"-cp", cp,
		mainClass, cfgFile)
	if command == nil {
		command = exec.Command
	}
	cmd := command(java, args...)
	cmd.Dir = dir
	cmd.Stdout = log
	cmd.Stderr = log
	// Should the test binary die without its clean-up (a panic, a timeout),
	// the kernel kills the server rather than leaving it running.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start zookeeper: %w", err)
	}
	p := &zooKeeperJVM{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// kill kills the JVM (SIGKILL: no clean shut-down, as a crash) and waits
// for it to exit.
func (p *zooKeeperJVM) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// awaitMode polls srvr through fourLetter until ready accepts its answer.
// It fails with an *earlyExitError, naming who, should the JVM exit first.
func awaitMode(fourLetter func(cmd string) (string, error), p *zooKeeperJVM, who string, log *SyncBuffer, timeout time.Duration, ready func(srvr string) bool) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		out, err := fourLetter("srvr")
		if err == nil && ready(out) {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("srvr answered %q", out)
		}
		last = err
		select {
		case <-p.exited:
			return &earlyExitError{who: who, err: p.waitErr, log: log.String()}
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s: %v; its log:\n%s", who, timeout, last, log)
		}
	}
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
	cfg := zooKeeperConfig(data, "127.0.0.1", port)
	var jvm []string
	z := &ZooKeeper{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: new(SyncBuffer)}
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
	z.jvm, err = startZooKeeperJVM(nil, java, cp, dir, "org.apache.zookeeper.server.ZooKeeperServerMain", cfgFile, jvm, z.log)
	if err != nil {
		return nil, err
	}
	err = awaitMode(z.FourLetter, z.jvm, "zookeeper", z.log, zooKeeperStartTimeout, func(out string) bool {
		return strings.Contains(out, "Mode: standalone")
	})
	if err != nil {
		z.Close()
		return nil, err
	}
	return z, nil
}

// FourLetter sends a four-letter-word command (srvr, ruok, cons, stat,
// mntr and wchp are enabled) to the plain client port and returns the
// answer.
func (z *ZooKeeper) FourLetter(cmd string) (string, error) { return fourLetter(z.addr, cmd) }

// fourLetter sends a four-letter-word command to the client port at addr
// and returns the answer.
func fourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
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
	z.once.Do(z.jvm.kill)
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

// freePort returns a port that was free on 127.0.0.1 a moment ago and
// that no other server of this process was given.
func freePort() (int, error) { return testkit.FreePort("127.0.0.1") }

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
