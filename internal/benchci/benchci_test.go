package benchci

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// envSelfTest breaks BenchmarkSelfTest's sub-benchmark "b" on purpose:
// "fail", "skip" or "nan".
const envSelfTest = "BATON_BENCHCI_SELFTEST"

var (
	_ = Register(BenchmarkSelfTest, "widgets==3", "sub-ms>0")
	_ = RegisterAlone(BenchmarkSelfTestAlone, "alone==1")
)

// BenchmarkSelfTestAlone is registered with RegisterAlone.
func BenchmarkSelfTestAlone(b *testing.B) {
	for b.Loop() {
	}
	b.ReportMetric(1, "alone")
}

// BenchmarkSelfTest is the benchmark this package's tests run through Run:
// it reports its size, 100 under -bench and 3 at the small size.
func BenchmarkSelfTest(b *testing.B) {
	for _, sub := range []string{"a", "b"} {
		b.Run(sub, func(b *testing.B) {
			widgets := Size(100, 3)
			start := time.Now()
			for b.Loop() {
				time.Sleep(time.Millisecond) // something to measure
			}
			v := float64(widgets)
			if sub == "b" {
				switch os.Getenv(envSelfTest) {
				case "fail":
					b.Fatal("broken on purpose")
				case "skip":
					b.Skip("skipped on purpose")
				case "nan":
					v = math.NaN()
				}
			}
			b.ReportMetric(v, "widgets")
			b.ReportMetric(float64(time.Since(start).Microseconds())/1000, "sub-ms")
		})
	}
}

func TestBenchmarks(t *testing.T) { Run(t) }

// TestRunChildCatchesBrokenBenchmarks: what Run reports on a benchmark that
// fails, skips, reports a NaN or figures its checks refuse.
func TestRunChildCatchesBrokenBenchmarks(t *testing.T) {
	const name = "BenchmarkSelfTest"
	res, out, err := runChild(name, 5*time.Minute)
	if err != nil || len(res.Failed)+len(res.Skipped) > 0 {
		t.Fatalf("the unbroken benchmark: %v, failed %v, skipped %v:\n%s", err, res.Failed, res.Skipped, out)
	}
	if errs := res.Check([]string{"widgets==3", "sub-ms>0"}); len(errs) > 0 {
		t.Errorf("the unbroken benchmark's checks: %v\n%s", errs, out)
	}
	if n := len(res.Lines); n != 2 {
		t.Errorf("%d result lines, want 2 (a and b):\n%s", n, out)
	}
	for _, tc := range []struct {
		checks []string
		want   string
	}{
		{[]string{"widgets>5"}, "widgets = 3, want widgets>5"},
		{[]string{"gadgets"}, "no result line reports gadgets"},
		{[]string{"widgets>"}, `check "widgets>": want UNIT>NUMBER`},
	} {
		if errs := res.Check(tc.checks); !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
			t.Errorf("checks %q: errors %q, want one with %q", tc.checks, errs, tc.want)
		}
	}

	res, out, err = runChild(name, 5*time.Minute, envSelfTest+"=fail")
	if err == nil || !slices.Contains(res.Failed, name+"/b") {
		t.Errorf("a failing sub-benchmark: exit %v, failed %v; want an error and %s/b:\n%s", err, res.Failed, name, out)
	}
	res, out, _ = runChild(name, 5*time.Minute, envSelfTest+"=skip")
	if !slices.Contains(res.Skipped, name+"/b") {
		t.Errorf("a skipping sub-benchmark: skipped %v, want %s/b:\n%s", res.Skipped, name, out)
	}
	res, out, _ = runChild(name, 5*time.Minute, envSelfTest+"=nan")
	if errs := res.Check(nil); !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, "widgets = NaN") }) {
		t.Errorf("a NaN metric: errors %q, want one naming it:\n%s", errs, out)
	}
}

func TestSizeIsFullUnderBench(t *testing.T) {
	// This test runs in the parent, never with BATON_BENCH_SMALL set by Run.
	if os.Getenv(EnvSmall) == "" && Size(100, 3) != 100 {
		t.Errorf("Size(100, 3) = %d outside Run, want 100", Size(100, 3))
	}
}

func TestDeclaredBenchmarks(t *testing.T) {
	got, err := DeclaredBenchmarks(filepath.Join("testdata", "unwired"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range got {
		names = append(names, d.Name)
	}
	if want := []string{"BenchmarkWired", "BenchmarkForgotten"}; !slices.Equal(names, want) {
		t.Fatalf("DeclaredBenchmarks = %v, want %v (excluded by build constraints, lower case or signature: none)", names, want)
	}
	if got[1].Pos != "x_test.go:9" {
		t.Errorf("BenchmarkForgotten at %s, want x_test.go:9", got[1].Pos)
	}
	// Of the two, the registered one passes and the forgotten one is named.
	mu.Lock()
	registered["BenchmarkWired"] = registration{name: "BenchmarkWired"}
	mu.Unlock()
	t.Cleanup(func() {
		mu.Lock()
		delete(registered, "BenchmarkWired")
		mu.Unlock()
	})
	if miss := unregistered(got); len(miss) != 1 || miss[0].Name != "BenchmarkForgotten" {
		t.Errorf("unregistered = %v, want BenchmarkForgotten alone", miss)
	}
}

func TestRegisterRefusesMalformedChecks(t *testing.T) {
	for _, c := range []string{"", "a b", ">3", "x>=y"} {
		if _, err := parseCheck(c); err == nil {
			t.Errorf("parseCheck(%q) = nil error", c)
		}
	}
	for c, want := range map[string]check{"x": {unit: "x"}, "lost/fault>=0": {unit: "lost/fault", op: ">=", arg: 0}, "a-ms<1.5": {unit: "a-ms", op: "<", arg: 1.5}} {
		if got, err := parseCheck(c); err != nil || got != want {
			t.Errorf("parseCheck(%q) = %+v, %v; want %+v", c, got, err, want)
		}
	}
}

// TestEveryBenchmarkPackageRunsInCI: every package of the repository
// (every module) that declares a benchmark runs them through Run, so that
// its own test checks that each is registered.
func TestEveryBenchmarkPackageRunsInCI(t *testing.T) {
	root := filepath.Join("..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("the repository's root: %v", err)
	}
	var checked int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		switch name := d.Name(); {
		case path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules"):
			return filepath.SkipDir
		}
		declared, err := DeclaredBenchmarks(path)
		if err != nil || len(declared) == 0 {
			return err
		}
		checked++
		rel, _ := filepath.Rel(root, path)
		runs, err := callsRun(path)
		if err != nil {
			return err
		}
		if !runs {
			t.Errorf("%s declares %d benchmarks (%s first) but no test calls benchci.Run: add "+
				"func TestBenchmarks(t *testing.T) { benchci.Run(t) } and register each (see package internal/benchci)",
				rel, len(declared), declared[0].Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 2 {
		t.Errorf("found benchmarks in %d packages; bench and bench/kubernetes have some", checked)
	}
}

// callsRun reports whether a test file of dir calls benchci.Run.
func callsRun(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return false, err
	}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return false, err
		}
		found := false
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return !found
			}
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr: // benchci.Run, from another package
				if x, ok := fn.X.(*ast.Ident); ok && x.Name == "benchci" && fn.Sel.Name == "Run" {
					found = true
				}
			case *ast.Ident: // Run, in this package's own test
				found = f.Name.Name == "benchci" && fn.Name == "Run"
			}
			return !found
		})
		if found {
			return true, nil
		}
	}
	return false, nil
}
