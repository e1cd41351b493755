package testserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// DynaliteVersion is the dynalite release that tools/dynalite/package.json
// pins (npm ci installs it, with its package-lock.json).
const DynaliteVersion = "4.0.0"

// dynaliteHint tells a developer how to install the emulator.
const dynaliteHint = "testserver.StartDynalite runs dynalite " + DynaliteVersion + " (a DynamoDB emulator on Node.js, MIT) " +
	"from tools/dynalite/node_modules: install Node.js and run `npm ci` in tools/dynalite (.ci/run does)"

// DynaliteProc is one running dynalite, an in-memory DynamoDB emulator that
// speaks DynamoDB's JSON wire protocol.
type DynaliteProc struct {
	// Endpoint is its URL, http://127.0.0.1:PORT: an SDK client's
	// BaseEndpoint.
	Endpoint string
	// Addr is its loopback host:port.
	Addr string
	// Out is its output.
	Out *SyncBuffer

	script, path string
	port         int
	stop         func()
}

// Stop kills the emulator, and with it every table. It is safe to call more
// than once; the test's cleanup calls it too.
func (d *DynaliteProc) Stop() { d.stop() }

// DynaliteScript returns the path of the script that runs dynalite
// (tools/dynalite/serve.js: dynalite's command line in a process that
// survives a client hanging up mid-request), or an error saying how to
// install it.
func DynaliteScript() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "tools", "dynalite", "serve.js")
	if _, err := os.Stat(filepath.Join(root, "tools", "dynalite", "node_modules", "dynalite", "cli.js")); err != nil {
		return "", fmt.Errorf("%w\n%s", err, dynaliteHint)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("%w\n%s", err, dynaliteHint)
	}
	return script, nil
}

// StartDynalite runs dynalite on a free loopback port, in memory, with
// tables created, updated and deleted at once (no CREATING state). It is
// stopped when the test ends, and its output logged if the test failed. A
// missing emulator skips the test, or fails it under BATON_REQUIRE_SERVERS.
func StartDynalite(t testing.TB) *DynaliteProc {
	t.Helper()
	script, err := DynaliteScript()
	if err != nil {
		Unavailable(t, "dynalite", err)
	}
	var errs []error
	for range 3 { // a free port chosen may be taken before dynalite binds it
		d, err := tryDynalite(script, 0, "")
		if err == nil {
			t.Cleanup(func() {
				d.stop()
				if t.Failed() {
					o := d.Out.String()
					if len(o) > 3000 {
						o = "..." + o[len(o)-3000:]
					}
					t.Logf("dynalite output:\n%s", o)
				}
			})
			return d
		}
		errs = append(errs, err)
	}
	Unavailable(t, "dynalite", errors.Join(errs...))
	return nil
}

// NewDynalite starts dynalite outside a test (the chaos harness), on a free
// loopback port, keeping its tables in LevelDB under dir, so that Restart
// brings them back. The caller stops it with Stop.
func NewDynalite(dir string) (*DynaliteProc, error) {
	script, err := DynaliteScript()
	if err != nil {
		return nil, err
	}
	var errs []error
	for range 3 {
		d, err := tryDynalite(script, 0, filepath.Join(dir, "dynalite"))
		if err == nil {
			return d, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// Restart stops the emulator and starts it again on the same port: with
// its tables when it keeps them on disk (NewDynalite), and with none when
// wipe is set or it kept them in memory.
func (d *DynaliteProc) Restart(wipe bool) error {
	d.stop()
	if wipe && d.path != "" {
		if err := os.RemoveAll(d.path); err != nil {
			return err
		}
	}
	var errs []error
	for range 50 { // the port may linger a moment after the old process
		n, err := tryDynalite(d.script, d.port, d.path)
		if err == nil {
			d.Out, d.stop = n.Out, n.stop
			return nil
		}
		errs = append(errs, err)
		time.Sleep(100 * time.Millisecond)
	}
	return errors.Join(errs...)
}

func tryDynalite(script string, port int, path string) (*DynaliteProc, error) {
	if port == 0 {
		// dynalite takes no port 0 (it reads it as its default, 4567).
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	out := new(SyncBuffer)
	args := []string{script, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"}
	if path != "" {
		args = append(args, "--path", path)
	}
	cmd := exec.Command("node", args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			<-exited
		})
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	ready := "listening at: http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	// dynalite prints its address once it listens; nothing else says so.
	for !strings.Contains(out.String(), ready) {
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("dynalite did not listen on %s within 30s; output:\n%s", addr, out)
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("dynalite exited before listening (%v); output:\n%s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return &DynaliteProc{Endpoint: "http://" + addr, Addr: addr, Out: out, script: script, path: path, port: port, stop: stop}, nil
}

// CreateTable creates table, on-demand, with the string partition key key,
// through DynamoDB's JSON protocol (dynalite checks no signature), so that
// a harness without the AWS SDK can make a backend's table.
func (d *DynaliteProc) CreateTable(table, key string) error {
	body := fmt.Sprintf(`{"TableName":%q,"BillingMode":"PAY_PER_REQUEST","AttributeDefinitions":[{"AttributeName":%q,"AttributeType":"S"}],"KeySchema":[{"AttributeName":%q,"KeyType":"HASH"}]}`, table, key, key)
	req, err := http.NewRequest(http.MethodPost, d.Endpoint+"/", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("X-Amz-Target", "DynamoDB_20120810.CreateTable")
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDBATONTEST/20250101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0")
	client := http.Client{Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && !strings.Contains(string(reply), "ResourceInUseException") {
		return fmt.Errorf("dynalite: create table %s: %s: %s", table, resp.Status, reply)
	}
	return nil
}
