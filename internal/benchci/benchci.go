// Package benchci runs a package's benchmarks as tests, at a small size, so
// that the README's test command (`go test -race -timeout 30m work`) exercises every
// benchmark on every CI run and a benchmark cannot rot unnoticed.
//
// What it guarantees: each registered benchmark completed once (one
// iteration of every sub-benchmark, -benchtime 1x) at its small size, under
// the test binary's own build (the race detector included), without
// failing or skipping, and reported the metrics its registration names,
// each a finite number that passes the registration's check (a hand-over
// happened, a count is above zero). What it does not: it asserts nothing
// about speed. The small size measures nothing worth publishing, and the
// checks are bounds of sanity, never of time; the figures come from
// running the benchmarks themselves with -bench, at their full size.
//
// A package adopts it in three parts:
//
//   - every Benchmark function of the package is registered, next to it,
//     with the metrics it must report:
//
//     var _ = benchci.Register(BenchmarkCrashFailover, "failover-median-ms>0")
//
//   - the sizes that make a benchmark slow (windows, iteration counts,
//     leases, TTLs where the window follows them) go through Size, which
//     returns the full size unless the benchmark runs through Run:
//
//     window := benchci.Size(10*time.Second, time.Second)
//
//   - one test runs them all:
//
//     func TestBenchmarks(t *testing.T) { benchci.Run(t) }
//
// Run first checks that every Benchmark function in the package's test
// files is registered (so that a new benchmark that was not wired in fails
// the tests), then runs each registered benchmark in a child process of
// the test binary:
//
//	TESTBINARY -test.run='^$' -test.bench='^BenchmarkX$' -test.benchtime=1x -test.v
//
// with BATON_BENCH_SMALL=1 in its environment, and checks the benchmark
// result lines it prints. The small runs mostly wait (TTLs, windows,
// servers starting), so two run at once; a benchmark that loads the
// machine on purpose registers with RegisterAlone and runs by itself. A child process, rather than a call, because only
// the testing package's own runner gives a benchmark a *testing.B whose
// b.Loop, b.Run and b.ReportMetric behave as under -bench, with failures
// and logs reported; so the bodies stay what -bench measures, unchanged.
// The same small run by hand:
//
//	BATON_BENCH_SMALL=1 go test -run '^$' -bench . -benchtime 1x ./bench
//
// It is for tests only (it imports testing).
package benchci

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvSmall is the environment variable that makes Size return the small
// size: Run sets it to "1" in the child processes that run the benchmarks.
const EnvSmall = "BATON_BENCH_SMALL"

// small is read once: the size must not change while a benchmark runs.
var small = os.Getenv(EnvSmall) == "1"

// Small reports whether the benchmarks run at their small size, as they do
// under Run (BATON_BENCH_SMALL=1). It is safe for concurrent use.
func Small() bool { return small }

// Size returns small when the benchmarks run at their small size (see
// Small), and full otherwise, as under `go test -bench`. A benchmark keeps
// its measurement logic and takes only its sizes from Size, so that its
// published figures stay comparable. Size is safe for concurrent use, and
// may initialise package-level variables.
func Size[T any](full, small T) T {
	if Small() {
		return small
	}
	return full
}

// registration is one registered benchmark.
type registration struct {
	name   string
	checks []check
	alone  bool // run with no other benchmark beside it
}

var (
	mu         sync.Mutex
	registered = map[string]registration{}
)

// Register registers bench, a Benchmark function of the calling test
// package, so that Run runs it at its small size, and names what it must
// report. Each check is a metric's unit as the benchmark passes it to
// b.ReportMetric, alone ("heap-MB": reported, a finite number) or with a
// bound ("failover-median-ms>0", "lost/fault>=0"; the operators are >, >=,
// <, <= and ==, then a number). A metric is checked on every result line
// that reports it (every sub-benchmark's), and at least one must. Register
// panics on a malformed check or a benchmark registered twice, so that the
// package's tests fail at once. It returns true, for use as
//
//	var _ = benchci.Register(BenchmarkX, "unit>0")
//
// It is safe for concurrent use.
func Register(bench func(*testing.B), checks ...string) bool {
	return register(bench, false, checks)
}

// RegisterAlone is Register for a benchmark that loads the machine on
// purpose (a CPU hog, stopped processes): Run runs it before the others,
// with none beside it, so that it disturbs none of them.
func RegisterAlone(bench func(*testing.B), checks ...string) bool {
	return register(bench, true, checks)
}

func register(bench func(*testing.B), alone bool, checks []string) bool {
	name := funcName(bench)
	r := registration{name: name, alone: alone}
	for _, c := range checks {
		ck, err := parseCheck(c)
		if err != nil {
			panic(fmt.Sprintf("benchci.Register(%s): %v", name, err))
		}
		r.checks = append(r.checks, ck)
	}
	mu.Lock()
	defer mu.Unlock()
	if _, dup := registered[name]; dup {
		panic(fmt.Sprintf("benchci.Register: %s registered twice", name))
	}
	registered[name] = r
	return true
}

// funcName is the unqualified name of the function f.
func funcName(f func(*testing.B)) string {
	full := runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
	return full[strings.LastIndexByte(full, '.')+1:]
}

// check is one metric's check: its unit, and an optional bound.
type check struct {
	unit string
	op   string // "" for none: reported and finite only
	arg  float64
}

// checkOps are the operators of a check, longest first so that ">=" is
// not read as ">".
var checkOps = []string{">=", "<=", "==", ">", "<"}

func parseCheck(s string) (check, error) {
	for _, op := range checkOps {
		if unit, arg, ok := strings.Cut(s, op); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(arg), 64)
			if err != nil || strings.TrimSpace(unit) == "" {
				return check{}, fmt.Errorf("check %q: want UNIT%sNUMBER", s, op)
			}
			return check{unit: strings.TrimSpace(unit), op: op, arg: v}, nil
		}
	}
	if strings.TrimSpace(s) == "" || strings.ContainsAny(s, " \t") {
		return check{}, fmt.Errorf("check %q: want a metric's unit, optionally with a bound (UNIT>0)", s)
	}
	return check{unit: s}, nil
}

func (c check) String() string {
	if c.op == "" {
		return c.unit
	}
	return c.unit + c.op + strconv.FormatFloat(c.arg, 'g', -1, 64)
}

// holds reports whether v passes c.
func (c check) holds(v float64) bool {
	switch c.op {
	case ">":
		return v > c.arg
	case ">=":
		return v >= c.arg
	case "<":
		return v < c.arg
	case "<=":
		return v <= c.arg
	case "==":
		return v == c.arg
	}
	return true
}

// Run checks that every Benchmark function in the package's test files is
// registered (subtest "registered"), then runs each registered benchmark,
// in name order, at its small size in a child process of the test binary
// (subtest named after it) and checks what it reported: at least one
// result line, every metric finite, every registered check passed, no
// sub-benchmark failed or skipped. When the benchmark skips (a server it
// needs is missing), the subtest skips too, unless BATON_REQUIRE_SERVERS=1
// (as in CI), where it fails. Each subtest logs the benchmark's result
// lines; a failing one also logs the child's whole output.
//
// Run must be called from the package's test, in the package's directory
// (where `go test` runs it), and the test binary must not be run with
// -test.run or -test.bench patterns that the child would need: it passes
// its own.
func Run(t *testing.T) {
	t.Helper()
	t.Run("registered", CheckRegistered)
	mu.Lock()
	var regs []registration
	for _, r := range registered {
		regs = append(regs, r)
	}
	mu.Unlock()
	slices.SortFunc(regs, func(a, b registration) int { return strings.Compare(a.name, b.name) })
	// The small runs mostly wait (TTLs, windows, servers starting), so
	// they run Parallel at a time; those registered with RegisterAlone
	// run first, one by one (parallel subtests start once Run returns).
	sem := make(chan struct{}, Parallel)
	for _, r := range regs {
		t.Run(r.name, func(t *testing.T) {
			if !r.alone {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
			}
			runSmall(t, r)
		})
	}
}

// Parallel is how many benchmarks Run runs at once (but those registered
// with RegisterAlone), also bounded by -test.parallel.
const Parallel = 2

// CheckRegistered fails t for every Benchmark function declared in the
// test files of the current directory (the package under test) that the
// test binary's build includes and that is not registered with Register.
// Run calls it; a package may call it alone too.
func CheckRegistered(t *testing.T) {
	t.Helper()
	declared, err := DeclaredBenchmarks(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range unregistered(declared) {
		t.Errorf("%s: %s is not run in CI: register it with benchci.Register(%s, \"METRIC>0\", ...) next to it "+
			"(see package internal/benchci), and give its slow sizes a small one with benchci.Size", d.Pos, d.Name, d.Name)
	}
}

// unregistered returns the benchmarks of declared that are not registered.
func unregistered(declared []Declared) []Declared {
	mu.Lock()
	defer mu.Unlock()
	var out []Declared
	for _, d := range declared {
		if _, ok := registered[d.Name]; !ok {
			out = append(out, d)
		}
	}
	return out
}

// Declared is a Benchmark function declared in a test file.
type Declared struct {
	Name string
	Pos  string // file:line, relative to the directory
}

// DeclaredBenchmarks lists the Benchmark functions (func BenchmarkXxx(b
// *testing.B), as `go test` finds them) declared in the _test.go files of
// dir that the current build configuration includes (build constraints
// and file name suffixes honoured), in file and line order.
func DeclaredBenchmarks(dir string) ([]Declared, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	var out []Declared
	fset := token.NewFileSet()
	for _, path := range files {
		if ok, err := build.Default.MatchFile(dir, filepath.Base(path)); err != nil || !ok {
			if err != nil {
				return nil, fmt.Errorf("benchci: %s: %w", path, err)
			}
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("benchci: %w", err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !isBenchmark(fn) {
				continue
			}
			p := fset.Position(fn.Pos())
			out = append(out, Declared{Name: fn.Name.Name, Pos: fmt.Sprintf("%s:%d", filepath.Base(p.Filename), p.Line)})
		}
	}
	return out, nil
}

// isBenchmark reports whether fn is a benchmark as `go test` sees one:
// named Benchmark or BenchmarkXxx where Xxx does not start with a lower-case
// letter, with one parameter of type *testing.B.
func isBenchmark(fn *ast.FuncDecl) bool {
	name, ok := strings.CutPrefix(fn.Name.Name, "Benchmark")
	if !ok || (name != "" && name[0] >= 'a' && name[0] <= 'z') {
		return false
	}
	params := fn.Type.Params.List
	if len(params) != 1 || len(params[0].Names) > 1 || fn.Type.Results != nil {
		return false
	}
	star, ok := params[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "B"
}

// ChildTimeout bounds each benchmark's small run (its child process's
// -test.timeout), or the test's own deadline less 30 s, if sooner. It is a
// bound on a hang, not on speed: the slowest small run takes about a
// minute on a quiet 2-core machine, a few on a busy one.
const ChildTimeout = 6 * time.Minute

// runSmall runs r's benchmark in a child process at its small size and
// checks its output.
func runSmall(t *testing.T, r registration) {
	// The child's own timeout ends it with a stack dump of where it hung,
	// and leaves the other benchmarks their time; the margin leaves this
	// test the time to report it.
	timeout := ChildTimeout
	if d, ok := t.Deadline(); ok {
		timeout = min(timeout, time.Until(d)-30*time.Second)
		if timeout <= 0 {
			t.Fatalf("no time left to run %s", r.name)
		}
	}
	start := time.Now()
	res, out, runErr := runChild(r.name, timeout)
	took := time.Since(start).Round(100 * time.Millisecond)

	for _, l := range res.Lines {
		t.Log(l.Raw)
	}
	// The CPU time is the child's and that of the descendants it waited
	// for (servers, peers' tools): the cost of the run, which the wall
	// time shows only on a quiet machine.
	t.Logf("%s at its small size: %d result lines in %s, %s of CPU", r.name, len(res.Lines), took, res.CPU.Round(100*time.Millisecond))
	if runErr != nil || len(res.Failed) > 0 {
		t.Fatalf("%s failed (%v; failed: %v); its output:\n%s", r.name, runErr, res.Failed, out)
	}
	if len(res.Skipped) > 0 {
		if os.Getenv("BATON_REQUIRE_SERVERS") == "1" {
			t.Fatalf("%s skipped %v with BATON_REQUIRE_SERVERS=1; its output:\n%s", r.name, res.Skipped, out)
		}
		if len(res.Lines) == 0 {
			t.Skipf("%s skipped %v; its output:\n%s", r.name, res.Skipped, out)
		}
		t.Logf("%s skipped %v", r.name, res.Skipped)
	}
	if errs := res.check(r.checks); len(errs) > 0 {
		t.Errorf("%s reported implausible figures:\n  %s\nits output:\n%s", r.name, strings.Join(errs, "\n  "), out)
	}
}

// runChild runs the benchmark name of this test binary once, at its small
// size, in a child process that times out after timeout, and returns what
// it printed, parsed and whole, and how it exited.
func runChild(name string, timeout time.Duration, env ...string) (Output, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0],
		"-test.run=^$",
		"-test.bench=^"+regexp.QuoteMeta(name)+"$",
		"-test.benchtime=1x",
		"-test.count=1",
		"-test.v",
		"-test.timeout="+timeout.String(),
	)
	cmd.Env = append(append(os.Environ(), EnvSmall+"=1"), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	res := ParseOutput(out.String())
	if st := cmd.ProcessState; st != nil {
		res.CPU = st.UserTime() + st.SystemTime()
	}
	return res, out.String(), err
}

// Output is what a benchmark run printed, as ParseOutput reads it.
type Output struct {
	Lines   []Result
	Failed  []string // names of the benchmarks that printed --- FAIL
	Skipped []string // names of the benchmarks that printed --- SKIP
	// CPU is the user and system time of the process that printed it and
	// of the descendants it waited for, when known (Run's child processes).
	CPU time.Duration
}

// Result is one benchmark result line: the benchmark's full name (with
// the -GOMAXPROCS suffix), its iterations, and its metrics by unit (ns/op
// and the custom ones).
type Result struct {
	Name    string
	N       int
	Metrics map[string]float64
	Raw     string
}

// resultLine matches the start of a benchmark result line, as the testing
// package prints it (name, iterations, then "VALUE UNIT" pairs).
var resultLine = regexp.MustCompile(`^(Benchmark\S*)\s+(\d+)\s+(.*\S)\s*$`)

// ParseOutput reads the output of a test binary run with -test.bench and
// -test.v. A line that matches a result line's start but whose pairs do not
// parse is taken as no result line (a log line that happens to start
// with a benchmark's name).
func ParseOutput(out string) Output {
	var o Output
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if name, ok := strings.CutPrefix(trimmed, "--- FAIL: "); ok {
			o.Failed = append(o.Failed, strings.Fields(name)[0])
			continue
		}
		if name, ok := strings.CutPrefix(trimmed, "--- SKIP: "); ok {
			o.Skipped = append(o.Skipped, strings.Fields(name)[0])
			continue
		}
		m := resultLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		f := strings.Fields(m[3])
		if len(f)%2 != 0 {
			continue
		}
		r := Result{Name: m[1], N: n, Metrics: map[string]float64{}, Raw: line}
		ok := true
		for i := 0; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				ok = false
				break
			}
			r.Metrics[f[i+1]] = v
		}
		if ok {
			o.Lines = append(o.Lines, r)
		}
	}
	return o
}

// Check returns what is wrong with o's result lines: none at all, an
// iteration count below one, a metric that is not a finite number, a
// check's metric that no line reports, or a value that fails its check.
func (o Output) Check(checks []string) []string {
	cks := make([]check, 0, len(checks))
	var errs []string
	for _, c := range checks {
		ck, err := parseCheck(c)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		cks = append(cks, ck)
	}
	return append(errs, o.check(cks)...)
}

func (o Output) check(checks []check) []string {
	if len(o.Lines) == 0 {
		return []string{"no benchmark result line"}
	}
	var errs []string
	for _, l := range o.Lines {
		if l.N < 1 {
			errs = append(errs, fmt.Sprintf("%s: %d iterations", l.Name, l.N))
		}
		for _, unit := range slices.Sorted(maps.Keys(l.Metrics)) {
			if v := l.Metrics[unit]; math.IsNaN(v) || math.IsInf(v, 0) {
				errs = append(errs, fmt.Sprintf("%s: %s = %v", l.Name, unit, v))
			}
		}
	}
	for _, c := range checks {
		seen := false
		for _, l := range o.Lines {
			v, ok := l.Metrics[c.unit]
			if !ok {
				continue
			}
			seen = true
			if !c.holds(v) {
				errs = append(errs, fmt.Sprintf("%s: %s = %v, want %s", l.Name, c.unit, v, c))
			}
		}
		if !seen {
			errs = append(errs, fmt.Sprintf("no result line reports %s", c.unit))
		}
	}
	return errs
}
