package aws

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/batonhq/baton/internal/awsfake"

	"github.com/batonhq/baton/internal/testserver"
)

// The IMDS tests run the real amazon-ec2-metadata-mock.

// metadataMockInstance is the instance ID in the mock's default data.
const metadataMockInstance = "i-1234567890abcdef0"

// startMetadataMock runs the mock on a loopback port with IMDSv2 required
// (a request without a session token gets 401), stopped when the test ends,
// and returns its endpoint URL and its output.
func startMetadataMock(t *testing.T) (string, *testserver.SyncBuffer) {
	t.Helper()
	m := testserver.StartMetadataMock(t, 0, "")
	return m.URL, m.Out
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
