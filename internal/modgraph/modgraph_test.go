// Package modgraph_test checks the rule the repository's modules are cut
// by: a program that imports the core and one backend has, in its module
// graph, that backend's client and nothing of any other backend, the CLI,
// Prometheus or the test tooling. It builds small consumer modules outside
// the repository, as a user's program would be, and reads their graphs with
// the go command. It imports nothing outside the standard library and this
// module.
package modgraph_test

import (
	"bufio"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/batonhq/baton/internal/testserver"
)

const root = "github.com/batonhq/baton"

// family is a set of third-party modules, named by patterns: a module path
// (which also matches its major versions, path/vN), or a prefix ending in *.
type family struct {
	name     string
	patterns []string
}

func (f family) has(path string) bool {
	return slices.ContainsFunc(f.patterns, func(p string) bool {
		if prefix, ok := strings.CutSuffix(p, "*"); ok {
			return strings.HasPrefix(path, prefix)
		}
		return path == p || strings.HasPrefix(path, p+"/v")
	})
}

// The backends' clients. A consumer may have its own backend's family, and
// whatever that family requires in turn (raft's bolt store brings cobra,
// its metrics library Prometheus); no other.
var (
	etcdClient    = family{"etcd's client", []string{"go.etcd.io/etcd/*"}}
	consulAPI     = family{"Consul's API", []string{"github.com/hashicorp/consul/*"}}
	zkClient      = family{"go-zookeeper", []string{"github.com/go-zookeeper/zk"}}
	raftLib       = family{"hashicorp/raft", []string{"github.com/hashicorp/raft", "github.com/hashicorp/raft-*"}}
	clientGo      = family{"client-go", []string{"k8s.io/*", "sigs.k8s.io/*"}}
	pgxDriver     = family{"pgx", []string{"github.com/jackc/*"}}
	goRedis       = family{"go-redis", []string{"github.com/redis/go-redis"}}
	awsSDK        = family{"the AWS SDK", []string{"github.com/aws/aws-sdk-go-v2*", "github.com/aws/smithy-go"}}
	gocron        = family{"gocron", []string{"github.com/go-co-op/gocron"}}
	cobra         = family{"cobra (the CLI and chaos)", []string{"github.com/spf13/cobra"}}
	prometheus    = family{"Prometheus (the agent's metrics)", []string{"github.com/prometheus/*"}}
	heavyFamilies = []family{etcdClient, consulAPI, zkClient, raftLib, clientGo, pgxDriver, goRedis, awsSDK, gocron, cobra, prometheus}
)

// testTooling is never in a consumer's graph, not even through its own
// backend's client: servers and drivers that only the tests run.
var testTooling = family{"test tooling", []string{
	"go.etcd.io/etcd/server/*",
	"github.com/hashicorp/consul", // the server; its API is github.com/hashicorp/consul/api
	"k8s.io/kubernetes",
	"github.com/chromedp/*",
	"github.com/aws/amazon-ec2-metadata-mock",
	"github.com/go-redsync/*", // redsync: the Redis interop tests' peer
}}

type consumer struct {
	name    string
	imports []string // packages the consumer's main imports, besides the core
	own     []family // the clients its imports bring
	modules []string // the baton modules it may have, besides the root
}

var consumers = []consumer{
	{name: "core"},
	{name: "memory", imports: []string{root + "/backend/memory"}},
	{name: "etcd", imports: []string{root + "/backend/etcd"}, own: []family{etcdClient}, modules: []string{"backend/etcd"}},
	{name: "consul", imports: []string{root + "/backend/consul"}, own: []family{consulAPI}, modules: []string{"backend/consul"}},
	{name: "zookeeper", imports: []string{root + "/backend/zookeeper"}, own: []family{zkClient}, modules: []string{"backend/zookeeper"}},
	{name: "raft", imports: []string{root + "/backend/raft"}, own: []family{raftLib}, modules: []string{"backend/raft"}},
	{name: "kubernetes", imports: []string{root + "/backend/kubernetes"}, own: []family{clientGo}, modules: []string{"backend/kubernetes"}},
	{name: "postgres", imports: []string{root + "/backend/postgres"}, own: []family{pgxDriver}, modules: []string{"backend/postgres"}},
	{name: "dynamodb", imports: []string{root + "/backend/dynamodb"}, own: []family{awsSDK}, modules: []string{"backend/dynamodb"}},
	{name: "redis", imports: []string{root + "/backend/redis"}, own: []family{goRedis}, modules: []string{"backend/redis"}},
	// aws gives raft its peers and its secret, so it brings raft.
	{name: "aws", imports: []string{root + "/aws"}, own: []family{awsSDK, raftLib}, modules: []string{"aws", "backend/raft"}},
	{name: "gocronbaton", imports: []string{root + "/gocronbaton"}, own: []family{gocron}, modules: []string{"gocronbaton"}},
}

// TestConsumerGraphs builds each consumer (GOWORK=off, GOPROXY=off, every
// baton module replaced by its directory here) and fails if its graph has
// a module of a family it does not import, test tooling, or a baton module
// it does not use. The module counts are logged: go test -v -run
// TestConsumerGraphs ./internal/modgraph gives the figures of
// docs/modules.md.
func TestConsumerGraphs(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	repo, err := testserver.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	mods, sums := batonModules(t, repo)
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			dir := writeConsumer(t, repo, c, mods, sums)
			run(t, goBin, dir, "mod", "tidy", "-e")
			list := run(t, goBin, dir, "list", "-m", "-e", "-f", "{{.Path}}", "all")
			graph := parseGraph(run(t, goBin, dir, "mod", "graph"))
			names := strings.Fields(list)
			t.Logf("core + %s: go list -m all | wc -l = %d", c.name, len(names))
			for _, problem := range check(c, names, graph) {
				t.Error(problem)
			}
		})
	}
}

// check returns what is wrong with consumer c's module list, given its
// graph (requirer → required module paths).
func check(c consumer, modules []string, graph map[string][]string) []string {
	// Everything that c's own families require, at any depth, is theirs.
	theirs := map[string]bool{}
	var queue []string
	for _, m := range modules {
		if slices.ContainsFunc(c.own, func(f family) bool { return f.has(m) }) {
			queue = append(queue, m)
		}
	}
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		if theirs[m] {
			continue
		}
		theirs[m] = true
		queue = append(queue, graph[m]...)
	}
	requirers := func(m string) string {
		var by []string
		for from, to := range graph {
			if slices.Contains(to, m) {
				by = append(by, from)
			}
		}
		slices.Sort(by)
		return strings.Join(by, ", ")
	}
	var problems []string
	for _, f := range c.own {
		if !slices.ContainsFunc(modules, f.has) {
			problems = append(problems, fmt.Sprintf("no module of %s in the graph: the consumer imports it, so the graph is incomplete (is the module cache missing something? run go mod download in each module)", f.name))
		}
	}
	for _, m := range modules {
		switch {
		case m == "example.com/consumer" || m == root:
		case strings.HasPrefix(m, root+"/"):
			if !slices.Contains(c.modules, strings.TrimPrefix(m, root+"/")) {
				problems = append(problems, fmt.Sprintf("%s is in the graph (required by %s): the consumer does not import it", m, requirers(m)))
			}
		case testTooling.has(m):
			problems = append(problems, fmt.Sprintf("%s (%s) is in the graph, required by %s", m, testTooling.name, requirers(m)))
		case theirs[m]:
		default:
			for _, f := range heavyFamilies {
				if f.has(m) {
					problems = append(problems, fmt.Sprintf("%s (%s) is in the graph, required by %s; the consumer imports no package that needs it", m, f.name, requirers(m)))
				}
			}
		}
	}
	return problems
}

// TestCheckFindsStrays feeds check graphs with what it must report, so that
// TestConsumerGraphs cannot pass by reporting nothing.
func TestCheckFindsStrays(t *testing.T) {
	etcd := consumers[slices.IndexFunc(consumers, func(c consumer) bool { return c.name == "etcd" })]
	raft := consumers[slices.IndexFunc(consumers, func(c consumer) bool { return c.name == "raft" })]
	for _, tc := range []struct {
		name    string
		c       consumer
		modules []string
		graph   map[string][]string
		want    []string // substrings, one per problem
	}{{
		name:    "another backend's client through the root module",
		c:       etcd,
		modules: []string{"example.com/consumer", root, root + "/backend/etcd", "go.etcd.io/etcd/client/v3", "github.com/hashicorp/consul/api"},
		graph: map[string][]string{
			"example.com/consumer": {root, root + "/backend/etcd"},
			root:                   {"github.com/hashicorp/consul/api"},
			root + "/backend/etcd": {"go.etcd.io/etcd/client/v3"},
		},
		want: []string{"github.com/hashicorp/consul/api (Consul's API) is in the graph, required by " + root},
	}, {
		name:    "test tooling required by the backend's module",
		c:       etcd,
		modules: []string{"example.com/consumer", root, root + "/backend/etcd", "go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/server/v3"},
		graph: map[string][]string{
			"example.com/consumer": {root, root + "/backend/etcd"},
			root + "/backend/etcd": {"go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/server/v3"},
		},
		want: []string{"go.etcd.io/etcd/server/v3 (test tooling)"},
	}, {
		name:    "a baton module the consumer does not import",
		c:       etcd,
		modules: []string{"example.com/consumer", root, root + "/backend/etcd", root + "/bench", "go.etcd.io/etcd/client/v3"},
		graph: map[string][]string{
			"example.com/consumer": {root, root + "/backend/etcd"},
			root + "/backend/etcd": {"go.etcd.io/etcd/client/v3", root + "/bench"},
		},
		want: []string{root + "/bench is in the graph"},
	}, {
		name:    "cobra and Prometheus through raft's own client are raft's",
		c:       raft,
		modules: []string{"example.com/consumer", root, root + "/backend/raft", "github.com/hashicorp/raft-boltdb/v2", "go.etcd.io/bbolt", "github.com/spf13/cobra", "github.com/hashicorp/raft", "github.com/hashicorp/go-metrics", "github.com/prometheus/client_golang"},
		graph: map[string][]string{
			"example.com/consumer":                {root, root + "/backend/raft"},
			root + "/backend/raft":                {"github.com/hashicorp/raft", "github.com/hashicorp/raft-boltdb/v2"},
			"github.com/hashicorp/raft-boltdb/v2": {"go.etcd.io/bbolt"},
			"go.etcd.io/bbolt":                    {"github.com/spf13/cobra"},
			"github.com/hashicorp/raft":           {"github.com/hashicorp/go-metrics"},
			"github.com/hashicorp/go-metrics":     {"github.com/prometheus/client_golang"},
		},
	}, {
		name:    "cobra from the root module is not raft's",
		c:       raft,
		modules: []string{"example.com/consumer", root, root + "/backend/raft", "github.com/hashicorp/raft", "github.com/spf13/cobra"},
		graph: map[string][]string{
			"example.com/consumer": {root, root + "/backend/raft"},
			root:                   {"github.com/spf13/cobra"},
			root + "/backend/raft": {"github.com/hashicorp/raft"},
		},
		want: []string{"github.com/spf13/cobra (cobra (the CLI and chaos)) is in the graph, required by " + root},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := check(tc.c, tc.modules, tc.graph)
			if len(got) != len(tc.want) {
				t.Fatalf("check reported %d problems, want %d: %q", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// writeConsumer writes consumer c's module into a temporary directory: a
// main package importing the core and c's packages, requirements on the
// baton modules those live in (those of c.modules that exist: the others'
// packages come from the root module), a replace directive for every baton module
// (a user's would name released versions instead), and a go.sum seeded
// from the repository's, so that nothing is looked up.
func writeConsumer(t *testing.T, repo string, c consumer, mods map[string]string, sums []byte) string {
	t.Helper()
	dir := t.TempDir()
	var main strings.Builder
	fmt.Fprintf(&main, "package main\n\nimport (\n\t_ %q\n", root)
	for _, p := range c.imports {
		fmt.Fprintf(&main, "\t_ %q\n", p)
	}
	main.WriteString(")\n\nfunc main() {}\n")
	var gomod strings.Builder
	gomod.WriteString("module example.com/consumer\n\ngo 1.26.7\n\n")
	fmt.Fprintf(&gomod, "require %s v0.0.0-00010101000000-000000000000\n", root)
	for _, m := range c.modules {
		if _, ok := mods[root+"/"+m]; ok {
			fmt.Fprintf(&gomod, "require %s/%s v0.0.0-00010101000000-000000000000\n", root, m)
		}
	}
	for _, path := range slices.Sorted(maps.Keys(mods)) {
		fmt.Fprintf(&gomod, "replace %s => %s\n", path, mods[path])
	}
	for name, data := range map[string][]byte{"main.go": []byte(main.String()), "go.mod": []byte(gomod.String()), "go.sum": sums} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// batonModules returns the repository's modules (path → directory), the
// tools modules aside, and the lines of all their go.sum files.
func batonModules(t *testing.T, repo string) (map[string]string, []byte) {
	t.Helper()
	mods := map[string]string{}
	var sums []byte
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || path == filepath.Join(repo, "tools")) {
			return filepath.SkipDir
		}
		switch d.Name() {
		case "go.mod":
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			first, _, _ := strings.Cut(string(data), "\n")
			mods[strings.TrimSpace(strings.TrimPrefix(first, "module"))] = filepath.Dir(path)
		case "go.sum":
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sums = append(sums, data...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if mods[root] != repo {
		t.Fatalf("found no module %s at %s (found %v)", root, repo, mods)
	}
	return mods, sums
}

// parseGraph reads `go mod graph` into requirer → required module paths,
// versions dropped.
func parseGraph(out string) map[string][]string {
	graph := map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		from, _, _ = strings.Cut(from, "@")
		to, _, _ = strings.Cut(to, "@")
		if !slices.Contains(graph[from], to) {
			graph[from] = append(graph[from], to)
		}
	}
	return graph
}

// run runs the go command in dir with nothing fetched from the network:
// what the consumers need is what the repository's own modules need, which
// `go mod download` has put in the module cache (.ci/run does it for each
// module).
func run(t *testing.T, goBin, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local", "GOSUMDB=off")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return string(out)
}
