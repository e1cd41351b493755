package backend_test

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// TestThirdPartyBackendPassesBatontest builds the backend of
// docs/backends/writing.md, which uses only the public kit, in a scratch
// module outside this repository (as a third party's module would be, with
// this repository standing in for the published baton module), and runs its
// tests there: batontest's whole suite and the data-loss attack. An
// internal package, a name the kit does not export or a guarantee the kit
// does not keep fails it.
func TestThirdPartyBackendPassesBatontest(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	goMod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(goMod, []byte("module github.com/batonhq/baton\n")) {
		t.Fatalf("%s is not the root module of github.com/batonhq/baton", repo)
	}
	goLine := ""
	for line := range strings.Lines(string(goMod)) {
		if strings.HasPrefix(line, "go ") {
			goLine = strings.TrimSpace(line)
			break
		}
	}
	if goLine == "" {
		t.Fatalf("no go directive in %s/go.mod", repo)
	}

	doc := filepath.Join(repo, "docs", "backends", "writing.md")
	files := scratchFiles(t, doc)
	for _, want := range []string{"dirlease.go", "dirlease_test.go"} {
		if _, ok := files[want]; !ok {
			t.Fatalf("%s has no %q block marked <!-- scratch: %s -->", doc, want, want)
		}
	}

	dir := t.TempDir()
	if rel, err := filepath.Rel(repo, dir); err == nil && !strings.HasPrefix(rel, "..") {
		t.Fatalf("the scratch module %s is inside the repository %s; set TMPDIR elsewhere", dir, repo)
	}
	mod := fmt.Sprintf("module example.com/dirlease\n\n%s\n\nrequire github.com/batonhq/baton v0.0.0-00010101000000-000000000000\n\nreplace github.com/batonhq/baton => %s\n", goLine, repo)
	files["go.mod"] = mod
	// The root module's checksums cover everything the scratch module can
	// need, so that nothing is fetched (GOPROXY=off) or looked up.
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	files["go.sum"] = string(sum)
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH: %v", err)
	}
	args := []string{"test", "-count=1", "-v"}
	if raceEnabled() {
		args = append(args, "-race")
	}
	args = append(args, "./...")
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in the scratch module %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	// The run must have been the suite's, not an empty one.
	for _, want := range []string{"--- PASS: TestConformance/OneHolderAmongTwentyCandidates", "--- PASS: TestTokensRiseAcrossDataLoss"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("the scratch module's tests did not report %q:\n%s", want, out)
		}
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "--- ") || strings.HasPrefix(line, "ok") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

// scratchFiles returns the code blocks of the Markdown file doc that follow
// a line <!-- scratch: NAME -->, by NAME.
func scratchFiles(t *testing.T, doc string) map[string]string {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]string{}
	var name string // the file of the block being read or about to start
	var body strings.Builder
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case in && line == "```":
			files[name], in, name = body.String(), false, ""
		case in:
			body.WriteString(line + "\n")
		case strings.HasPrefix(line, "<!-- scratch: ") && strings.HasSuffix(line, " -->"):
			name = strings.TrimSuffix(strings.TrimPrefix(line, "<!-- scratch: "), " -->")
		case name != "" && strings.HasPrefix(line, "```"):
			in = true
			body.Reset()
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if in {
		t.Fatalf("%s: the block of %s is not closed", doc, name)
	}
	return files
}

// raceEnabled reports whether this test binary was built with -race, so
// that the scratch module's tests run as this one does.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
