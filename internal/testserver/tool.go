package testserver

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Tool is a program the tests run that is built from a pinned module in a
// tools module of this repository (../../tools, or a module below it), so
// that the main module does not depend on it. The binary is built once per
// version into the user's cache directory and reused by every later run.
type Tool struct {
	// Name names the binary and its cache directory.
	Name string
	// Module and Version are the pinned module; the tools module's go.mod
	// must require exactly that version.
	Module, Version string
	// Package is the main package to build (Module itself, or below it).
	Package string
	// Dir is the tools module's directory, relative to the repository
	// root: "tools" or "tools/consul".
	Dir string
	// Env is added to the go command's environment (GONOSUMDB=..., say).
	Env []string
}

// CacheDir returns where the binary is kept:
// $XDG_CACHE_HOME/baton-tools/NAME-VERSION (~/.cache when unset). A tool
// whose main package is in this repository (tools/etcd, tools/chromedp)
// gets NAME-VERSION-HASH, HASH from its module's files, so that a changed
// program is built again rather than a stale binary reused.
func (tool Tool) CacheDir() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	name := tool.Name + "-" + tool.Version
	if strings.HasPrefix(tool.Package, "github.com/batonhq/baton/") {
		h, err := tool.sourceHash()
		if err != nil {
			return "", err
		}
		name += "-" + h
	}
	return filepath.Join(cache, "baton-tools", name), nil
}

// sourceHash is a short hash of the names and contents of the files in the
// tool's module directory (not below it).
func (tool Tool) sourceHash() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, tool.Dir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(data))
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// Hint tells a developer how the tool is obtained, for Unavailable.
func (tool Tool) Hint() string {
	return fmt.Sprintf("the tests build %s on first use from the %s module (`cd %s && go build -o %s %s`), "+
		"which needs the go command and the module proxy or a warm module cache, into "+
		"$XDG_CACHE_HOME/baton-tools/%s-%s (~/.cache when unset)",
		tool.Name, tool.Dir, tool.Dir, tool.Name, tool.Package, tool.Name, tool.Version)
}

// MetadataMock is amazon-ec2-metadata-mock, the IMDS the discovery tests
// run, pinned in the tools module (tools/go.mod).
var MetadataMock = Tool{
	Name:    "ec2-metadata-mock",
	Module:  "github.com/aws/amazon-ec2-metadata-mock",
	Version: "v1.12.0",
	Package: "github.com/aws/amazon-ec2-metadata-mock/cmd",
	Dir:     "tools",
}

// LambdaRIE is the AWS Lambda Runtime Interface Emulator, which runs a
// provided.al2023 function's bootstrap as Lambda does and takes
// invocations over HTTP (StartLambdaRIE). Its module publishes no
// releases: tools/lambdarie pins a pseudo-version.
var LambdaRIE = Tool{
	Name:    "aws-lambda-rie",
	Module:  "github.com/aws/aws-lambda-runtime-interface-emulator",
	Version: "v0.0.0-20261030222936-bef5c4ba774d",
	Package: "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie",
	Dir:     "tools/lambdarie",
}

// Tools lists every tool the tests run, for buildtools to build up front.
var Tools = []Tool{MetadataMock, EtcdTool, ChromedpTool, ConsulTool, KubeAPIServerTool, KubectlTool, KubeControllerManagerTool, LambdaRIE}

var (
	toolsMu    sync.Mutex
	toolsBuilt = map[string]*toolBuild{}
)

type toolBuild struct {
	once sync.Once
	bin  string
	err  error
}

// Binary returns the path of the tool's binary, building it first if the
// cache has none. Concurrent callers in one test binary share one build,
// and concurrent test binaries wait for each other's (a file lock).
func (tool Tool) Binary() (string, error) {
	toolsMu.Lock()
	b, ok := toolsBuilt[tool.Name+"@"+tool.Version]
	if !ok {
		b = &toolBuild{}
		toolsBuilt[tool.Name+"@"+tool.Version] = b
	}
	toolsMu.Unlock()
	b.once.Do(func() { b.bin, b.err = tool.build() })
	return b.bin, b.err
}

func (tool Tool) build() (string, error) {
	dir, err := tool.CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, tool.Name)
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	mod := filepath.Join(root, tool.Dir)
	gomod, err := os.ReadFile(filepath.Join(mod, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("the tools module: %w", err)
	}
	if !strings.Contains(string(gomod), tool.Module+" "+tool.Version) {
		return "", fmt.Errorf("%s/go.mod does not require %s %s: keep the two in step", mod, tool.Module, tool.Version)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// One build per machine at a time: `go test ./...` runs several test
	// binaries that want the same tool at once, and a cold consul build
	// takes minutes; the others wait for it and then find the binary.
	lock, err := os.OpenFile(filepath.Join(dir, ".build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	if fi, err := os.Stat(bin); err == nil && fi.Mode().IsRegular() {
		return bin, nil // built by another test binary while we waited
	}
	// Build beside the final name and rename, so that a reader never sees
	// half a binary.
	tmp, err := os.CreateTemp(dir, tool.Name+"-*.tmp")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := exec.Command(goTool, "build", "-o", tmp.Name(), tool.Package)
	cmd.Dir = mod
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), tool.Env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %v\n%s", tool.Package, mod, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// RepoRoot finds the repository (the root module's directory) by walking up
// from the working directory: a test runs in its package's directory, in
// the root module or in one nested in the repository.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/batonhq/baton\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no github.com/batonhq/baton go.mod above the working directory")
		}
		dir = parent
	}
}

// ToolError reports that a tool's binary could not be built or found; tests
// hand it to Unavailable rather than failing outright.
type ToolError struct {
	Tool Tool
	Err  error
}

// Error implements error.
func (e *ToolError) Error() string { return fmt.Sprintf("%v\n%s", e.Err, e.Tool.Hint()) }

// Unwrap returns the underlying error.
func (e *ToolError) Unwrap() error { return e.Err }
