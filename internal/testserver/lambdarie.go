package testserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// LambdaRIEProc is one running AWS Lambda Runtime Interface Emulator with
// a function's bootstrap: the function runs as Lambda runs it (the Runtime
// API, one invocation at a time per emulator), and Invoke sends it events.
type LambdaRIEProc struct {
	// URL is the emulator's invocation endpoint.
	URL string
	// Out is the emulator's and the function's output.
	Out *SyncBuffer

	stop func()
}

// StartLambdaRIE runs bootstrap under the emulator on a free loopback
// port, with env (the function's configuration: credentials, endpoints,
// its own variables) added to a minimal environment. It is stopped when
// the test ends, its output logged if the test failed. A missing emulator
// skips the test, or fails it under BATON_REQUIRE_SERVERS.
func StartLambdaRIE(t testing.TB, bootstrap string, env []string) *LambdaRIEProc {
	t.Helper()
	bin, err := LambdaRIE.Binary()
	if err != nil {
		Unavailable(t, "aws-lambda-rie", fmt.Errorf("%w\n%s", err, LambdaRIE.Hint()))
	}
	var errs []error
	for range 3 {
		p, err := tryLambdaRIE(bin, bootstrap, env)
		if err == nil {
			t.Cleanup(func() {
				p.stop()
				if t.Failed() {
					o := p.Out.String()
					if len(o) > 6000 {
						o = "..." + o[len(o)-6000:]
					}
					t.Logf("aws-lambda-rie output:\n%s", o)
				}
			})
			return p
		}
		errs = append(errs, err)
	}
	Unavailable(t, "aws-lambda-rie", errors.Join(errs...))
	return nil
}

func tryLambdaRIE(bin, bootstrap string, env []string) (*LambdaRIEProc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	apiPort, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	out := new(SyncBuffer)
	cmd := exec.Command(bin, "--runtime-interface-emulator-address", addr,
		"--runtime-api-address", "127.0.0.1:"+strconv.Itoa(apiPort), bootstrap)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			// The emulator and the bootstrap it started: its process group.
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("aws-lambda-rie did not listen on %s within 30s; output:\n%s", addr, out)
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("aws-lambda-rie exited before listening (%v); output:\n%s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return &LambdaRIEProc{URL: "http://" + addr + "/2015-03-31/functions/function/invocations", Out: out, stop: stop}, nil
}

// Invoke sends event to the function and returns its response body, or an
// error that holds the function's error (the emulator answers 200 with
// the error's JSON and the X-Amz-Function-Error header).
func (p *LambdaRIEProc) Invoke(event []byte) ([]byte, error) {
	client := http.Client{Timeout: 5 * time.Minute}
	resp, err := client.Post(p.URL, "application/json", bytes.NewReader(event))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Amz-Function-Error") != "" || strings.Contains(string(body), `"errorType"`) {
		return body, fmt.Errorf("invocation failed (%s): %s", resp.Status, body)
	}
	return body, nil
}
