package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// goEnv reads one setting of the go command.
func goEnv(ctx context.Context, name string) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// proxyEnv is the environment in which the go command reads the
// repository's modules from dist/proxy and every other module from the
// local module cache, then from the usual proxy. GOSUMDB does not know the
// release's modules until their tags are pushed, hence GONOSUMDB for them;
// every other module is checked against the go.sum files as usual.
func (c *config) proxyEnv(ctx context.Context, gopath string) ([]string, error) {
	modcache, err := goEnv(ctx, "GOMODCACHE")
	if err != nil {
		return nil, err
	}
	upstream, err := goEnv(ctx, "GOPROXY")
	if err != nil {
		return nil, err
	}
	nosumdb, err := goEnv(ctx, "GONOSUMDB")
	if err != nil {
		return nil, err
	}
	proxy := "file://" + filepath.ToSlash(filepath.Join(c.dist, "proxy"))
	if modcache != "" {
		proxy += ",file://" + filepath.ToSlash(filepath.Join(modcache, "cache", "download"))
	}
	if upstream != "" && upstream != "off" {
		proxy += "," + upstream
	}
	if nosumdb != "" {
		nosumdb += ","
	}
	nosumdb += rootModule
	return []string{
		"GOPROXY=" + proxy,
		"GONOSUMDB=" + nosumdb,
		"GOPATH=" + gopath,
		"GOMODCACHE=" + filepath.Join(gopath, "pkg", "mod"),
		"GOFLAGS=-modcacherw",
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	}, nil
}

// buildTags leave out of the release binary what only costs size:
// grpcnotrace drops gRPC's golang.org/x/net/trace (etcd's client uses
// gRPC), whose debug pages render with html/template at init; a reachable
// template execution makes the linker keep every exported method of every
// type stored in an interface (it cannot tell which methods a template
// calls by name), and with them the whole EC2, SSM and Kubernetes API
// clients.
const buildTags = "grpcnotrace"

// build runs `go install …/cmd/baton@version` for p from dist/proxy, in a
// GOPATH of its own, so that the archives carry what users of go install
// build, stamped with the commit. It returns the binary's path.
func (c *config) build(ctx context.Context, work string, p platform, commit string, commitTime time.Time) (string, error) {
	gopath := filepath.Join(work, "gopath")
	env, err := c.proxyEnv(ctx, gopath)
	if err != nil {
		return "", err
	}
	ldflags := fmt.Sprintf("-s -w -X main.releaseCommit=%s -X main.releaseCommitTime=%s", commit, commitTime.Format(time.RFC3339))
	cmd := exec.CommandContext(ctx, "go", "install", "-trimpath", "-tags="+buildTags, "-ldflags="+ldflags, cliPackage+"@"+c.tag)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), env...)
	// CGO_ENABLED=0: a static binary, which runs in an image without libc
	// and on any Linux distribution.
	cmd.Env = append(cmd.Env, "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go install %s@%s for %s: %v\n%s", cliPackage, c.tag, p, err, out.String())
	}
	hostOS, _ := goEnv(ctx, "GOHOSTOS")
	hostArch, _ := goEnv(ctx, "GOHOSTARCH")
	bin := filepath.Join(gopath, "bin", "baton")
	if p.os != hostOS || p.arch != hostArch {
		bin = filepath.Join(gopath, "bin", p.os+"_"+p.arch, "baton")
	}
	// The next platform's go install writes its own; keep this one.
	kept := filepath.Join(work, "bin", p.os+"_"+p.arch, "baton")
	if err := copyFile(bin, kept, 0o755); err != nil {
		return "", fmt.Errorf("the binary go install made for %s: %w", p, err)
	}
	return kept, nil
}
