package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// cliPackage is the package the archives, image and packages carry.
const cliPackage = "github.com/batonhq/baton/cmd/baton"

// platform is one GOOS/GOARCH target.
type platform struct{ os, arch string }

func (p platform) String() string { return p.os + "/" + p.arch }

func parsePlatform(s string) (platform, error) {
	goos, goarch, ok := strings.Cut(s, "/")
	switch {
	case !ok || goos == "" || goarch == "":
		return platform{}, fmt.Errorf("-platforms: %q is not GOOS/GOARCH (e.g. linux/amd64)", s)
	case goos != "linux" && goos != "darwin":
		return platform{}, fmt.Errorf("-platforms: %q: baton is released for linux and darwin only", s)
	case goarch != "amd64" && goarch != "arm64":
		return platform{}, fmt.Errorf("-platforms: %q: baton is released for amd64 and arm64 only", s)
	}
	return platform{goos, goarch}, nil
}

// config is one release.
type config struct {
	repo      string     // the repository's root
	tag       string     // vX.Y.Z
	dist      string     // output directory
	platforms []platform // binaries to build
	log       io.Writer  // progress
	keepBins  string     // when set, each binary is copied to keepBins/OS_ARCH/baton
}

// result names what a release made, for its callers (the test).
type result struct {
	dist      string
	commit    string              // the tag's commit, stamped into the binaries
	modules   []string            // module paths released
	archives  map[platform]string // archive path per platform
	binaries  map[platform]string // the binary inside each archive, under keepBins
	debs      map[string]string   // package path per Debian architecture
	imageDir  string              // the OCI layout
	proxyDir  string              // the GOPROXY=file:// directory
	releaseID string              // the release commit the nested modules' tags name
}

func (c *config) logf(format string, args ...any) {
	if c.log != nil {
		fmt.Fprintf(c.log, "release: "+format+"\n", args...)
	}
}

// git runs git in the repository and returns its trimmed output.
func (c *config) git(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", c.repo}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = strings.TrimSpace(string(ee.Stderr))
		}
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, msg)
	}
	return strings.TrimSpace(string(out)), nil
}

// run makes the release.
func (c *config) run(ctx context.Context) (*result, error) {
	if c.tag == "" {
		return nil, &usageError{"-tag is required: the version to release, e.g. -tag v1.2.3 (tag HEAD with it first)"}
	}
	if !semver.IsValid(c.tag) || semver.Canonical(c.tag) != c.tag {
		return nil, &usageError{fmt.Sprintf("-tag %q is not a semantic version tag such as v1.2.3 or v1.2.3-rc.1", c.tag)}
	}
	if m := semver.Major(c.tag); m != "v0" && m != "v1" {
		return nil, &usageError{fmt.Sprintf("-tag %q: a major version above v1 needs /%s module paths, which the repository does not have", c.tag, m)}
	}
	if len(c.platforms) == 0 {
		return nil, &usageError{"-platforms is empty: name at least one GOOS/GOARCH"}
	}
	repo, err := filepath.Abs(c.repo)
	if err != nil {
		return nil, err
	}
	c.repo = repo
	if c.dist == "" {
		c.dist = filepath.Join(repo, "dist")
	}
	if c.dist, err = filepath.Abs(c.dist); err != nil {
		return nil, err
	}

	// A release is built from what the tag names, so the tree must be it.
	status, err := c.git(ctx, nil, "status", "--porcelain", "--untracked-files=normal")
	if err != nil {
		return nil, err
	}
	if status != "" {
		return nil, &usageError{fmt.Sprintf("the tree at %s has uncommitted changes; commit or stash them (git status):\n%s", repo, status)}
	}
	head, err := c.git(ctx, nil, "rev-parse", "HEAD")
	if err != nil {
		return nil, err
	}
	tagged, err := c.git(ctx, nil, "rev-parse", "--verify", "--quiet", c.tag+"^{commit}")
	if err != nil {
		return nil, &usageError{fmt.Sprintf("tag %s does not exist: tag the commit to release first (git tag %s)", c.tag, c.tag)}
	}
	if tagged != head {
		return nil, &usageError{fmt.Sprintf("HEAD (%.12s) is not at %s (%.12s): check out the tag first (git checkout %s)", head, c.tag, tagged, c.tag)}
	}
	if entries, err := os.ReadDir(c.dist); err == nil && len(entries) > 0 {
		return nil, &usageError{fmt.Sprintf("%s is not empty: remove it first (each release starts from an empty dist)", c.dist)}
	}
	commitTimeStr, err := c.git(ctx, nil, "show", "-s", "--format=%cI", head)
	if err != nil {
		return nil, err
	}
	commitTime, err := time.Parse(time.RFC3339, commitTimeStr)
	if err != nil {
		return nil, fmt.Errorf("commit time %q: %v", commitTimeStr, err)
	}
	commitTime = commitTime.UTC()

	work, err := os.MkdirTemp("", "baton-release-")
	if err != nil {
		return nil, err
	}
	defer removeAll(work)
	if err := os.MkdirAll(c.dist, 0o755); err != nil {
		return nil, err
	}
	res := &result{dist: c.dist, commit: head, archives: map[platform]string{}, binaries: map[platform]string{}, debs: map[string]string{}}

	c.logf("%s at %.12s: module versions", c.tag, head)
	mods, releaseCommit, err := c.releaseModules(ctx, work, commitTime)
	if err != nil {
		return nil, err
	}
	res.releaseID = releaseCommit
	res.proxyDir = filepath.Join(c.dist, "proxy")
	for _, m := range mods {
		res.modules = append(res.modules, m.path)
	}

	var checksummed []string
	for _, p := range c.platforms {
		c.logf("building %s for %s", cliPackage, p)
		bin, err := c.build(ctx, work, p, head, commitTime)
		if err != nil {
			return nil, err
		}
		res.binaries[p] = bin
		archive, err := c.archive(p, bin, commitTime)
		if err != nil {
			return nil, err
		}
		res.archives[p] = archive
		sbomPath, err := c.sbom(p, bin)
		if err != nil {
			return nil, err
		}
		checksummed = append(checksummed, archive, sbomPath)
	}

	var linux []platform
	for _, p := range c.platforms {
		if p.os == "linux" {
			linux = append(linux, p)
		}
	}
	if len(linux) > 0 {
		c.logf("image for %v", linux)
		if res.imageDir, err = c.image(linux, res.binaries, head, commitTime); err != nil {
			return nil, err
		}
		for _, p := range linux {
			c.logf("Debian package for %s", p)
			deb, err := c.deb(p, res.binaries[p], commitTime)
			if err != nil {
				return nil, err
			}
			res.debs[p.arch] = deb
			checksummed = append(checksummed, deb)
		}
	}
	if err := writeChecksums(filepath.Join(c.dist, "checksums.txt"), checksummed); err != nil {
		return nil, err
	}
	for p, bin := range res.binaries {
		if c.keepBins == "" {
			delete(res.binaries, p)
			continue
		}
		dst := filepath.Join(c.keepBins, p.os+"_"+p.arch, "baton")
		if err := copyFile(bin, dst, 0o755); err != nil {
			return nil, err
		}
		res.binaries[p] = dst
	}
	c.logf("done: %s", c.dist)
	return res, nil
}

// writeChecksums writes sha256sum's format: "HEX  NAME", sorted by name.
func writeChecksums(path string, files []string) error {
	sort.Slice(files, func(i, j int) bool { return filepath.Base(files[i]) < filepath.Base(files[j]) })
	var b strings.Builder
	for _, f := range files {
		sum, err := sha256File(f)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, filepath.Base(f))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// removeAll removes a tree that may hold the go command's read-only
// module cache.
func removeAll(dir string) {
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(path, 0o755)
		}
		return nil
	})
	os.RemoveAll(dir)
}

// version is the tag without its "v", as archive and package names use it.
func (c *config) version() string { return strings.TrimPrefix(c.tag, "v") }
