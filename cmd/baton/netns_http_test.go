//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/batonhq/baton/internal/netns"
)

// nsHTTPPort is the port of every baton's --http in the namespace tests:
// on the host's loopback, each host having a network stack of its own.
const nsHTTPPort = "8080"

// nsGet asks the baton on h for path on its --http server, from inside h
// (this test binary run there as getMain), and returns the status and body.
func nsGet(h *netns.Host, path string) (int, string, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := h.Command(ctx, self)
	cmd.Env = testEnv(childEnv+"=get", getURLEnv+"=http://127.0.0.1:"+nsHTTPPort+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, "", fmt.Errorf("GET %s on %s: %v: %s", path, h, err, strings.TrimSpace(stderr.String()))
	}
	code, body, _ := strings.Cut(string(out), "\n")
	status, err := strconv.Atoi(code)
	if err != nil {
		return 0, "", fmt.Errorf("GET %s on %s: no status in %q", path, h, out)
	}
	return status, body, nil
}

// nsGroup is a raft member's GET /v1/group.
type nsGroup struct {
	ID      string   `json:"id"`
	State   string   `json:"state"`
	Leader  string   `json:"leader"`
	Voters  []string `json:"voters"`
	Members []string `json:"members"`
}

// nsGroupOf returns h's member's view of its group; ok is false while it
// is not in one.
func nsGroupOf(h *netns.Host) (g nsGroup, ok bool, err error) {
	status, body, err := nsGet(h, "/v1/group")
	if err != nil || status != http.StatusOK {
		return g, false, err
	}
	if err := json.Unmarshal([]byte(body), &g); err != nil {
		return g, false, fmt.Errorf("GET /v1/group on %s: %v: %s", h, err, body)
	}
	return g, g.Leader != "" && len(g.Voters) > 0, nil
}

// nsHealthOf returns the health check of the baton on h.
func nsHealthOf(h *netns.Host) (health, error) {
	status, body, err := nsGet(h, "/v1/health/leader")
	if err != nil {
		return health{}, err
	}
	hc := health{code: status}
	if err := json.Unmarshal([]byte(body), &hc); err != nil {
		return health{}, fmt.Errorf("GET /v1/health/leader on %s: %v: %s", h, err, body)
	}
	return hc, nil
}
