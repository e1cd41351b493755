package main

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// testTag is the version the test releases, in a clone of its own.
const testTag = "v0.0.0-releasetest.1"

// testPlatforms are the targets the test builds: by default the host's
// linux one only, since each target is a full build of the CLI (minutes on
// two cores); BATON_RELEASE_PLATFORMS widens it (e.g. to defaultPlatforms).
func testPlatforms(t *testing.T) []platform {
	s := os.Getenv("BATON_RELEASE_PLATFORMS")
	if s == "" {
		s = "linux/" + runtime.GOARCH
	}
	var ps []platform
	for _, f := range strings.Split(s, ",") {
		p, err := parsePlatform(f)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return ps
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// cloneAtTag clones the repository's HEAD into a temp dir and tags it.
func cloneAtTag(t *testing.T) string {
	t.Helper()
	top := strings.TrimSpace(run(t, ".", nil, "git", "rev-parse", "--show-toplevel"))
	clone := filepath.Join(t.TempDir(), "baton")
	run(t, ".", nil, "git", "clone", "--quiet", "--no-tags", top, clone)
	run(t, clone, nil, "git", "tag", testTag)
	return clone
}

// TestRelease makes a release at a test tag in a clone of the repository
// and checks that each artifact works: go install from the file proxy in
// an empty GOPATH, the archive's binary, the image read back from its
// layout and its binary run, the Debian package installed, verified by
// systemd-analyze and removed.
func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI: minutes")
	}
	clone := cloneAtTag(t)
	commit := strings.TrimSpace(run(t, clone, nil, "git", "rev-parse", "HEAD"))
	c := &config{repo: clone, tag: testTag, platforms: testPlatforms(t), log: testLog{t}, keepBins: t.TempDir()}
	res, err := c.run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	host := platform{runtime.GOOS, runtime.GOARCH}

	t.Run("checksums", func(t *testing.T) { checkChecksums(t, res) })
	t.Run("modules", func(t *testing.T) { checkModules(t, clone, res) })
	t.Run("go install", func(t *testing.T) { checkGoInstall(t, res) })
	t.Run("dead code", func(t *testing.T) { checkDeadCode(t, res) })
	t.Run("archive", func(t *testing.T) {
		for p, a := range res.archives {
			files := readTarGz(t, a)
			if got := sortedKeys(files); strings.Join(got, " ") != "README.md baton" {
				t.Errorf("%s holds %v, want README.md and baton", a, got)
			}
			if p != host {
				continue
			}
			bin := filepath.Join(t.TempDir(), "baton")
			if err := os.WriteFile(bin, files["baton"], 0o755); err != nil {
				t.Fatal(err)
			}
			checkVersion(t, bin, commit)
		}
	})
	t.Run("sbom", func(t *testing.T) { checkSBOM(t, res) })
	t.Run("image", func(t *testing.T) { checkImage(t, res, commit) })
	t.Run("deb", func(t *testing.T) { checkDeb(t, res, commit) })
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// checkVersion runs `baton version` and wants the test tag and commit.
func checkVersion(t *testing.T, bin, commit string) {
	t.Helper()
	out := run(t, "", nil, bin, "version")
	if !strings.HasPrefix(out, "baton "+testTag+"\n") {
		t.Errorf("%s version printed %q, want version %s", bin, out, testTag)
	}
	if commit != "" && !strings.Contains(out, "commit: "+commit+" (") {
		t.Errorf("%s version printed %q, want commit %s", bin, out, commit)
	}
}

func checkChecksums(t *testing.T, res *result) {
	data, err := os.ReadFile(filepath.Join(res.dist, "checksums.txt"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("checksums.txt line %q is not HEX  NAME", sc.Text())
		}
		got, err := sha256File(filepath.Join(res.dist, name))
		if err != nil {
			t.Fatal(err)
		}
		if got != sum {
			t.Errorf("checksums.txt: %s %s, file hashes %s", name, sum, got)
		}
		listed[name] = true
	}
	for _, a := range res.archives {
		for _, f := range []string{filepath.Base(a), strings.TrimSuffix(filepath.Base(a), ".tar.gz") + ".sbom.cdx.json"} {
			if !listed[f] {
				t.Errorf("checksums.txt does not list %s", f)
			}
		}
	}
	for _, d := range res.debs {
		if !listed[filepath.Base(d)] {
			t.Errorf("checksums.txt does not list %s", filepath.Base(d))
		}
	}
}

// checkModules: every module of the repository outside tools/ is in the
// proxy at the tag, with a zip the go command accepts and a go.mod without
// replace directives that names the repository's modules at the tag; the
// nested modules' tags name the release commit, whose only changes are
// go.mod and go.sum files.
func checkModules(t *testing.T, clone string, res *result) {
	var want []string
	for _, f := range strings.Fields(run(t, clone, nil, "git", "ls-files", "--", "go.mod", "*/go.mod")) {
		dir := path.Dir(f)
		if dir == "tools" || strings.HasPrefix(dir, "tools/") {
			continue
		}
		p := rootModule
		if dir != "." {
			p += "/" + dir
		}
		want = append(want, p)
	}
	got := append([]string(nil), res.modules...)
	sort.Strings(want)
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("released modules %v, want %v", got, want)
	}
	for _, p := range got {
		esc, _ := module.EscapePath(p)
		vdir := filepath.Join(res.proxyDir, filepath.FromSlash(esc), "@v")
		list, err := os.ReadFile(filepath.Join(vdir, "list"))
		if err != nil || !strings.Contains(string(list), testTag+"\n") {
			t.Errorf("%s: @v/list %q (%v) lacks %s", p, list, err, testTag)
		}
		var info struct{ Version, Time string }
		data, err := os.ReadFile(filepath.Join(vdir, testTag+".info"))
		if err != nil || json.Unmarshal(data, &info) != nil || info.Version != testTag || info.Time == "" {
			t.Errorf("%s: .info %q (%v)", p, data, err)
		}
		if _, err := modzip.CheckZip(module.Version{Path: p, Version: testTag}, filepath.Join(vdir, testTag+".zip")); err != nil {
			t.Errorf("%s: zip: %v", p, err)
		}
		gomod, err := os.ReadFile(filepath.Join(vdir, testTag+".mod"))
		if err != nil {
			t.Fatal(err)
		}
		mf, err := modfile.Parse(p+"/go.mod", gomod, nil)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if len(mf.Replace) != 0 {
			t.Errorf("%s: the released go.mod keeps replace directives: %v", p, mf.Replace)
		}
		for _, r := range mf.Require {
			if strings.HasPrefix(r.Mod.Path, rootModule) && r.Mod.Version != testTag {
				t.Errorf("%s requires %s %s, want %s", p, r.Mod.Path, r.Mod.Version, testTag)
			}
		}
	}
	if at := strings.TrimSpace(run(t, clone, nil, "git", "rev-parse", "cmd/baton/"+testTag+"^{commit}")); at != res.releaseID {
		t.Errorf("tag cmd/baton/%s at %s, want the release commit %s", testTag, at, res.releaseID)
	}
	for _, f := range strings.Fields(run(t, clone, nil, "git", "diff", "--name-only", testTag, res.releaseID)) {
		if path.Base(f) != "go.mod" && path.Base(f) != "go.sum" {
			t.Errorf("the release commit changes %s; it may change go.mod and go.sum files only", f)
		}
	}
}

// checkGoInstall runs go install …/cmd/baton@tag in an empty GOPATH with
// the release's proxy first and, for third-party modules, the local module
// cache as a second file proxy: nothing from the network. GOSUMDB=off: the
// checksum database is not reachable from every test machine (the go
// command reaches it through a network proxy, and there is none here); the
// third-party modules in the local cache were checked against it when they
// were downloaded, and the release's own modules are not in it until their
// tags are pushed. -trimpath lets the build reuse the packages the release
// compiled (a -trimpath build's compile cache keys do not depend on where
// the module cache is).
func checkGoInstall(t *testing.T, res *result) {
	modcache := strings.TrimSpace(run(t, "", nil, "go", "env", "GOMODCACHE"))
	gopath := t.TempDir()
	t.Cleanup(func() { removeAll(gopath) })
	env := []string{
		"GOPROXY=file://" + filepath.ToSlash(res.proxyDir) + ",file://" + filepath.ToSlash(filepath.Join(modcache, "cache", "download")),
		"GOSUMDB=off",
		"GOPATH=" + gopath,
		"GOMODCACHE=",
		"GOBIN=",
		"GOWORK=off",
		"GOFLAGS=-modcacherw",
		"GOTOOLCHAIN=local",
		"CGO_ENABLED=0",
	}
	run(t, t.TempDir(), env, "go", "install", "-trimpath", cliPackage+"@"+testTag)
	bin := filepath.Join(gopath, "bin", "baton")
	checkVersion(t, bin, "")
	// The library modules resolve the same way for a program that imports
	// one backend.
	consumer := t.TempDir()
	run(t, consumer, env, "go", "mod", "init", "example.com/consumer")
	run(t, consumer, env, "go", "get", rootModule+"/backend/etcd@"+testTag)
}

// checkDeadCode links the release binary again with the linker's
// dependency dump and wants no function in it that makes the linker keep
// every exported method of every type stored in an interface (a
// reflective call by method name, as text/template and html/template
// make): with one, the binary carried the whole EC2 and Kubernetes API
// clients and was more than twice its size.
func checkDeadCode(t *testing.T, res *result) {
	modcache := strings.TrimSpace(run(t, "", nil, "go", "env", "GOMODCACHE"))
	gopath := t.TempDir()
	t.Cleanup(func() { removeAll(gopath) })
	cmd := exec.Command("go", "install", "-trimpath", "-tags="+buildTags, "-ldflags=-dumpdep", cliPackage+"@"+testTag)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(),
		"GOPROXY=file://"+filepath.ToSlash(res.proxyDir)+",file://"+filepath.ToSlash(filepath.Join(modcache, "cache", "download")),
		"GOSUMDB=off", "GOPATH="+gopath, "GOMODCACHE=", "GOBIN=", "GOWORK=off", "GOFLAGS=-modcacherw",
		"GOTOOLCHAIN=local", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go install -ldflags=-dumpdep: %v\n%.4000s", err, out)
	}
	var culprits []string
	for _, line := range strings.Split(string(out), "\n") {
		if from, _, ok := strings.Cut(line, " <ReflectMethod> ->"); ok && !slices.Contains(culprits, from) {
			culprits = append(culprits, from)
		}
	}
	if len(culprits) > 0 {
		t.Errorf("the linker keeps every method of interface-stored types because of %v (a template execution? see docs/install.md, Binary size)", culprits)
	}
	if !strings.Contains(string(out), "main.main") {
		t.Fatalf("go install -ldflags=-dumpdep printed no dependency dump:\n%.2000s", out)
	}
}

func readTarGz(t *testing.T, file string) map[string][]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	return readTar(t, gz)
}

func readTar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
}

// checkSBOM: each archive's SBOM is CycloneDX naming the CLI at the tag and
// the modules its binary carries.
func checkSBOM(t *testing.T, res *result) {
	for p, a := range res.archives {
		data, err := os.ReadFile(strings.TrimSuffix(a, ".tar.gz") + ".sbom.cdx.json")
		if err != nil {
			t.Fatal(err)
		}
		var bom struct {
			BOMFormat string `json:"bomFormat"`
			Metadata  struct {
				Component struct{ Name, Version string }
			}
			Components []struct{ Name, Version string }
		}
		if err := json.Unmarshal(data, &bom); err != nil {
			t.Fatalf("%s SBOM: %v", p, err)
		}
		if bom.BOMFormat != "CycloneDX" || bom.Metadata.Component.Name != cliPackage || bom.Metadata.Component.Version != testTag {
			t.Errorf("%s SBOM: format %q, component %+v", p, bom.BOMFormat, bom.Metadata.Component)
		}
		names := map[string]bool{}
		for _, c := range bom.Components {
			names[c.Name] = true
		}
		for _, m := range []string{rootModule, rootModule + "/backend/etcd", "go.etcd.io/etcd/client/v3", "k8s.io/client-go", "std"} {
			if !names[m] {
				t.Errorf("%s SBOM lacks %s among %d components", p, m, len(bom.Components))
			}
		}
	}
}

// checkImage reads the OCI layout back: the index tagged with the version,
// one image per linux platform, each valid (digests and sizes), run as
// user 65532, with CA certificates and the binary and nothing else; the
// host's binary is extracted and run.
func checkImage(t *testing.T, res *result, commit string) {
	lp, err := layout.FromPath(res.imageDir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].MediaType != types.OCIImageIndex || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != strings.TrimPrefix(testTag, "v") {
		t.Fatalf("index.json: %+v, want one image index named %s", tm.Manifests, strings.TrimPrefix(testTag, "v"))
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("the image index does not validate: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var linux []string
	for p := range res.binaries {
		if p.os == "linux" {
			linux = append(linux, p.String())
		}
	}
	var plats []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("manifest %s has no platform", d.Digest)
		}
		plats = append(plats, d.Platform.OS+"/"+d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != imageUser || cf.OS != d.Platform.OS || cf.Architecture != d.Platform.Architecture {
			t.Errorf("%s: user %q, platform %s/%s", d.Digest, cf.Config.User, cf.OS, cf.Architecture)
		}
		files := imageFiles(t, img)
		if got := strings.Join(sortedKeys(files), " "); got != "etc/ssl/certs/ca-certificates.crt usr/local/bin/baton" {
			t.Errorf("%s/%s image holds %s, want the CA certificates and the binary only", cf.OS, cf.Architecture, got)
		}
		if d.Platform.OS != runtime.GOOS || d.Platform.Architecture != runtime.GOARCH {
			continue
		}
		bin := filepath.Join(t.TempDir(), "baton")
		if err := os.WriteFile(bin, files["usr/local/bin/baton"], 0o755); err != nil {
			t.Fatal(err)
		}
		checkVersion(t, bin, commit)
	}
	sort.Strings(plats)
	sort.Strings(linux)
	if strings.Join(plats, " ") != strings.Join(linux, " ") {
		t.Errorf("the index holds %v, want %v", plats, linux)
	}
}

func imageFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	if err := validate.Image(img); err != nil {
		t.Fatalf("the image does not validate: %v", err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range readTar(t, rc) {
			files[k] = v
		}
		rc.Close()
	}
	return files
}

// checkDeb installs the package with dpkg into a root of its own, runs its
// binary, verifies its units there with systemd-analyze (against copies of
// the host's own units, which the verification resolves dependencies in),
// and removes and purges it.
func checkDeb(t *testing.T, res *result, commit string) {
	deb := res.debs[runtime.GOARCH]
	if deb == "" || runtime.GOOS != "linux" {
		t.Skipf("no package for %s/%s in this release", runtime.GOOS, runtime.GOARCH)
	}
	for _, tool := range []string{"dpkg", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (Debian's dpkg and systemd packages; .ci/run installs them): %v", tool, err)
		}
	}
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "usr/lib/systemd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// dpkg looks for ldconfig and start-stop-daemon on PATH.
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	dpkg := []string{"--root=" + root, "--force-script-chrootless", "--log=/dev/null"}
	if os.Geteuid() != 0 {
		dpkg = append(dpkg, "--force-not-root")
	}
	run(t, "", env, "dpkg", append(dpkg, "-i", deb)...)
	if status := run(t, "", env, "dpkg-query", "--root="+root, "-W", "-f=${Status} ${Version}", "baton"); status != "install ok installed "+strings.ReplaceAll(strings.TrimPrefix(testTag, "v"), "-", "~") {
		t.Errorf("dpkg-query: %q", status)
	}
	checkVersion(t, filepath.Join(root, "usr/bin/baton"), commit)
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/baton.service"))
	if err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(root, debEnvFile(unit))
	if _, err := os.Stat(envFile); err != nil {
		t.Errorf("the environment file baton.service names: %v", err)
	}
	run(t, "", nil, "cp", "-R", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/"))
	verify := append([]string{"verify", "--root=" + root}, debUnits...)
	run(t, "", nil, "systemd-analyze", verify...)
	// The verification reads what the package installed: without the
	// binary's execute bit it fails.
	bin := filepath.Join(root, "usr/bin/baton")
	if err := os.Chmod(bin, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("systemd-analyze", verify...).CombinedOutput(); err == nil {
		t.Errorf("systemd-analyze verify passed with /usr/bin/baton not executable:\n%s", out)
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "", env, "dpkg", append(dpkg, "-r", "baton")...)
	for _, f := range []string{"usr/bin/baton", "lib/systemd/system/baton.service", "lib/systemd/system/baton-agent.service"} {
		if _, err := os.Stat(filepath.Join(root, f)); !os.IsNotExist(err) {
			t.Errorf("after dpkg -r, %s: %v", f, err)
		}
	}
	if _, err := os.Stat(envFile); err != nil {
		t.Errorf("dpkg -r removed the environment file, a conffile that stays until purge: %v", err)
	}
	run(t, "", env, "dpkg", append(dpkg, "--purge", "baton")...)
	if _, err := os.Stat(envFile); !os.IsNotExist(err) {
		t.Errorf("after dpkg --purge, %s: %v", envFile, err)
	}
	// Purged, dpkg knows the package no more (dpkg-query exits 1) or
	// records it as not installed.
	query := exec.Command("dpkg-query", "--root="+root, "-W", "-f=${db:Status-Abbrev}", "baton")
	query.Env = append(os.Environ(), env...)
	if out, err := query.Output(); err == nil && !strings.HasPrefix(string(out), "un") && !strings.HasPrefix(string(out), "pn") {
		t.Errorf("after purge dpkg-query says %q", out)
	}
}

// TestPlatformsFlag: a platform the CLI cannot be built for is a usage
// error that says why, before anything is built.
func TestPlatformsFlag(t *testing.T) {
	for _, tt := range []struct{ flag, want string }{
		{"windows/amd64", "linux and darwin only"},
		{"linux/386", "amd64 and arm64 only"},
		{"linux", "not GOOS/GOARCH"},
	} {
		err := runMain(t.Context(), []string{"-tag", "v1.0.0", "-platforms", tt.flag}, io.Discard)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("-platforms %s: %v, want a usage error saying %q", tt.flag, err, tt.want)
		}
	}
	for _, f := range strings.Split(defaultPlatforms, ",") {
		if _, err := parsePlatform(f); err != nil {
			t.Errorf("default platform %s: %v", f, err)
		}
	}
	if !strings.Contains(defaultPlatforms, "darwin/arm64") || !strings.Contains(defaultPlatforms, "darwin/amd64") {
		t.Errorf("defaultPlatforms = %q, want the darwin archives too", defaultPlatforms)
	}
	err := runMain(t.Context(), []string{"-repo", t.TempDir(), "-tag", "1.0"}, io.Discard)
	var ue *usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "semantic version") {
		t.Errorf("-tag 1.0: %v, want a usage error", err)
	}
}

// TestDebEnvFile: the package puts the environment file where baton.service
// reads it.
func TestDebEnvFile(t *testing.T) {
	for unit, want := range map[string]string{
		"[Service]\nEnvironmentFile=-/etc/baton/baton.env\nExecStart=/usr/bin/baton run\n": "/etc/baton/baton.env",
		"[Service]\nEnvironmentFile = /etc/default/baton-x\n":                              "/etc/default/baton-x",
		"[Service]\nExecStart=/usr/bin/baton run\n":                                        debEnvDefault,
		"[Service]\nEnvironmentFile=%E/baton.env\n":                                        debEnvDefault,
	} {
		if got := debEnvFile([]byte(unit)); got != want {
			t.Errorf("debEnvFile(%q) = %q, want %q", unit, got, want)
		}
	}
}
