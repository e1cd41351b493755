package aws

import (
	"context"
	"errors"
	"fmt"
	"github.com/batonhq/baton/internal/awsfake"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonhq/baton/internal/testserver"
)

// The IMDS tests run the real amazon-ec2-metadata-mock.
var metadataMock = testserver.MetadataMock

// metadataMockInstance is the instance ID in the mock's default data.
const metadataMockInstance = "i-1234567890abcdef0"

// startMetadataMock runs the mock on a loopback port with IMDSv2 required
// (a request without a session token gets 401), stopped when the test ends,
// and returns its endpoint URL and its output.
func startMetadataMock(t *testing.T) (string, *testserver.SyncBuffer) {
	t.Helper()
	bin, err := metadataMock.Binary()
	if err != nil {
		testserver.Unavailable(t, "ec2-metadata-mock", fmt.Errorf("%w\n%s", err, metadataMock.Hint()))
	}
	// The port is free when chosen but may be taken before the mock binds
	// it; then the mock exits and another port is tried.
	var errs []error
	for range 3 {
		url, out, err := tryStartMetadataMock(t, bin)
		if err == nil {
			return url, out
		}
		errs = append(errs, err)
	}
	testserver.Unavailable(t, "ec2-metadata-mock", fmt.Errorf("%w\n%s", errors.Join(errs...), metadataMock.Hint()))
	return "", nil
}

func tryStartMetadataMock(t *testing.T, bin string) (string, *testserver.SyncBuffer, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	// An empty home and working directory: the mock reads and may write
	// its configuration file there.
	home := t.TempDir()
	out := new(testserver.SyncBuffer)
	cmd := exec.Command(bin, "--hostname", "127.0.0.1", "--port", strconv.Itoa(port), "--imdsv2")
	cmd.Dir = home
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
	}

	url := "http://127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(30 * time.Second)
	for !metadataMockServes(url) {
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("ec2-metadata-mock did not serve on %s within 30s; output:\n%s", url, out)
		}
		// Poll: the mock gives no other sign that it listens.
		select {
		case err := <-exited:
			return "", nil, fmt.Errorf("ec2-metadata-mock exited before serving (%v); output:\n%s", err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("ec2-metadata-mock output:\n%s", out)
		}
	})
	return url, out, nil
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

func TestIMDSv2FindsOwnGroup(t *testing.T) {
	mock, mockOut := startMetadataMock(t)
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.AddGroup("api")
	f.Launch(metadataMockInstance, "web", "InService", "Healthy", "10.0.0.10")
	f.Launch("i-0b", "web", "InService", "Healthy", "10.0.0.11")
	f.Launch("i-1a", "api", "InService", "Healthy", "10.0.1.1")

	opts := fakeAWSOptions(t, f)
	opts.GroupName, opts.Region = "", "" // both from the instance's identity
	opts.IMDSEndpoint = mock
	a, clock := newTestASG(t, opts)
	if got, want := mustPeers(t, a), []string{"10.0.0.11:7000", "10.0.0.10:7000"}; !slices.Equal(got, want) {
		t.Errorf("Peers = %q, want %q", got, want)
	}
	g, err := a.Group(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if g.Self != metadataMockInstance || g.Name != "web" {
		t.Errorf("Group self %q name %q, want %s in web", g.Self, g.Name, metadataMockInstance)
	}
	if !strings.Contains(mockOut.String(), "Token validated") {
		t.Error("the mock validated no session token")
	}

	// The identity and the group are looked up once; refreshes ask only
	// for the group's members.
	clock.Advance(2 * DefaultCacheTTL)
	mustPeers(t, a)
	if n := f.CallCount("DescribeAutoScalingInstances"); n != 1 {
		t.Errorf("DescribeAutoScalingInstances called %d times over two refreshes, want 1", n)
	}
	if n := f.CallCount("DescribeAutoScalingGroups"); n != 2 {
		t.Errorf("DescribeAutoScalingGroups called %d times over two refreshes, want 2", n)
	}
}

func TestIMDSv2NotInGroup(t *testing.T) {
	mock, _ := startMetadataMock(t)
	f := awsfake.Start(t)
	f.AddGroup("web")
	f.Launch(metadataMockInstance, "", "", "", "10.0.0.10") // a lone instance

	opts := fakeAWSOptions(t, f)
	opts.GroupName, opts.Region = "", ""
	opts.IMDSEndpoint = mock
	a, _ := newTestASG(t, opts)
	_, err := a.Peers(context.Background())
	if !errors.Is(err, ErrNotInGroup) || !strings.Contains(err.Error(), metadataMockInstance) {
		t.Errorf("Peers error = %v, want ErrNotInGroup naming the instance", err)
	}
	if n := f.CallCount("DescribeAutoScalingGroups"); n != 0 {
		t.Errorf("DescribeAutoScalingGroups called %d times without a group", n)
	}
}

// imdsV1Only is a metadata service that refuses session tokens but would
// answer a request without one, as an instance with IMDSv1 only (or a
// hop-limited container) does.
type imdsV1Only struct {
	tokenStatus int

	mu       sync.Mutex
	tokenReq int
	gets     []string // the paths of every GET, with or without a token
}

func (s *imdsV1Only) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
		s.tokenReq++
		w.WriteHeader(s.tokenStatus)
		return
	}
	s.gets = append(s.gets, r.Method+" "+r.URL.Path)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"instanceId": "i-0v1only", "region": "us-east-1"}`)
}

func TestIMDSFailsClosedWithoutToken(t *testing.T) {
	// The statuses on which the SDK would fall back to IMDSv1 if allowed.
	for _, status := range []int{http.StatusForbidden, http.StatusNotFound, http.StatusMethodNotAllowed} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			v1 := &imdsV1Only{tokenStatus: status}
			imdsSrv := httptest.NewServer(v1)
			t.Cleanup(imdsSrv.Close)
			f := awsfake.Start(t)
			f.AddGroup("web")
			f.Launch("i-0v1only", "web", "InService", "Healthy", "10.0.0.1")

			opts := fakeAWSOptions(t, f)
			opts.GroupName, opts.Region = "", ""
			opts.IMDSEndpoint = imdsSrv.URL
			a, _ := newTestASG(t, opts)
			for call := range 2 { // the second call must not fall back either
				got, err := a.Peers(context.Background())
				if !errors.Is(err, ErrIdentity) {
					t.Fatalf("call %d: Peers = %q, %v; want ErrIdentity", call+1, got, err)
				}
				if call == 0 {
					t.Logf("error: %v", err)
				}
				if !strings.Contains(err.Error(), strconv.Itoa(status)) {
					t.Errorf("error %q does not give the status of the refused token request", err)
				}
			}
			v1.mu.Lock()
			defer v1.mu.Unlock()
			if v1.tokenReq == 0 {
				t.Error("no token was requested")
			}
			if len(v1.gets) != 0 {
				t.Errorf("the metadata service saw requests without a token: %q", v1.gets)
			}
			if n := f.TotalCalls(); n != 0 {
				t.Errorf("%d AWS API calls without an identity, want 0", n)
			}
		})
	}
}
