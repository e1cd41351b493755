package testserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// MetadataMockProc is one running amazon-ec2-metadata-mock.
type MetadataMockProc struct {
	// URL is its endpoint, http://127.0.0.1:PORT.
	URL string
	// Port is the loopback port it serves on.
	Port int
	// Out is its output.
	Out *SyncBuffer

	stop func()
}

// Stop kills the mock and waits for it. It is safe to call more than once;
// the test's cleanup calls it too.
func (m *MetadataMockProc) Stop() { m.stop() }

// StartMetadataMock runs the mock on 127.0.0.1:port (a free port when port
// is 0) with IMDSv2 required: a request without a session token gets 401.
// config, when not empty, is its configuration file (JSON); args go before
// the global flags (a mode such as "spot" or "asglifecycle", and its
// flags). The mock's delays count from its start. It is stopped when the
// test ends, and its output is logged if the test failed. A missing mock
// skips the test, or fails it under BATON_REQUIRE_SERVERS.
func StartMetadataMock(t testing.TB, port int, config string, args ...string) *MetadataMockProc {
	t.Helper()
	bin, err := MetadataMock.Binary()
	if err != nil {
		Unavailable(t, "ec2-metadata-mock", fmt.Errorf("%w\n%s", err, MetadataMock.Hint()))
	}
	var errs []error
	for range 3 { // a free port chosen may be taken before the mock binds it
		m, err := tryMetadataMock(t, bin, port, config, args)
		if err == nil {
			return m
		}
		errs = append(errs, err)
	}
	Unavailable(t, "ec2-metadata-mock", fmt.Errorf("%w\n%s", errors.Join(errs...), MetadataMock.Hint()))
	return nil
}

func tryMetadataMock(t testing.TB, bin string, port int, config string, args []string) (*MetadataMockProc, error) {
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	// An empty home and working directory: the mock reads, and may write,
	// its configuration file there.
	home := t.TempDir()
	args = append(slices.Clone(args), "--hostname", "127.0.0.1", "--port", strconv.Itoa(port), "--imdsv2")
	if config != "" {
		file := filepath.Join(home, "aemm-config.json")
		if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
			return nil, err
		}
		args = append(args, "--config-file", file)
	}
	out := new(SyncBuffer)
	cmd := exec.Command(bin, args...)
	cmd.Dir = home
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
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
			cmd.Process.Kill()
			<-exited
		})
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(30 * time.Second)
	for !metadataMockServes(url) {
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("ec2-metadata-mock did not serve on %s within 30s; output:\n%s", url, out)
		}
		// Poll: the mock gives no other sign that it listens.
		select {
		case err := <-exited:
			return nil, fmt.Errorf("ec2-metadata-mock exited before serving (%v); output:\n%s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			o := out.String()
			if len(o) > 3000 {
				o = "..." + o[len(o)-3000:]
			}
			t.Logf("ec2-metadata-mock %s output:\n%s", strings.Join(args, " "), o)
		}
	})
	return &MetadataMockProc{URL: url, Port: port, Out: out, stop: stop}, nil
}

// metadataMockServes reports whether an IMDSv2 server answers at url with
// a session token, which tells the mock from anything else that might have
// taken the port.
func metadataMockServes(url string) bool {
	req, err := http.NewRequest(http.MethodPut, url+"/latest/api/token", nil)
	if err != nil {
		return false
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	client := http.Client{Timeout: time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
