package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// rootModule is the repository's root module path; every module of the
// repository has it as a prefix.
const rootModule = "github.com/batonhq/baton"

// releasedModule is one module of the repository at the release.
type releasedModule struct {
	path    string   // module path
	dir     string   // slash path relative to the repository root; "." for the root
	deps    []string // the repository's modules it requires
	gomod   []byte   // its go.mod at the release
	modHash string   // go.sum's "/go.mod h1:" hash of gomod
	zipHash string   // go.sum's "h1:" hash of its zip
}

// tagName is the module's tag: the version with the module's directory as
// its prefix, as the go command looks tags up.
func (m *releasedModule) tagName(version string) string {
	if m.dir == "." {
		return version
	}
	return m.dir + "/" + version
}

// releaseModules finds the repository's modules, resolves their replace
// directives to the release version on a release commit on top of the tag,
// tags the nested modules there, and writes every module into dist/proxy.
// It returns the modules and the release commit.
func (c *config) releaseModules(ctx context.Context, work string, commitTime time.Time) ([]*releasedModule, string, error) {
	list, err := c.git(ctx, nil, "ls-files", "--", "go.mod", "*/go.mod")
	if err != nil {
		return nil, "", err
	}
	mods := map[string]*releasedModule{}
	for _, f := range strings.Split(list, "\n") {
		dir := path.Dir(f)
		// The tools modules pin the programs the tests run; they are not
		// part of what baton's users import or install.
		if dir == "tools" || strings.HasPrefix(dir, "tools/") || strings.Contains("/"+dir+"/", "/testdata/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(c.repo, filepath.FromSlash(f)))
		if err != nil {
			return nil, "", err
		}
		mf, err := modfile.ParseLax(f, data, nil)
		if err != nil {
			return nil, "", err
		}
		if mf.Module == nil {
			return nil, "", fmt.Errorf("%s has no module line", f)
		}
		want := rootModule
		if dir != "." {
			want = rootModule + "/" + dir
		}
		if mf.Module.Mod.Path != want {
			return nil, "", fmt.Errorf("%s: module %s, but the go command finds the module in directory %s only if it is %s", f, mf.Module.Mod.Path, dir, want)
		}
		mods[want] = &releasedModule{path: want, dir: dir, gomod: data}
	}
	if mods[rootModule] == nil {
		return nil, "", fmt.Errorf("no go.mod at the root of %s", c.repo)
	}
	for _, m := range mods {
		mf, _ := modfile.ParseLax(m.dir+"/go.mod", m.gomod, nil)
		for _, r := range mf.Require {
			if r.Mod.Path == rootModule || strings.HasPrefix(r.Mod.Path, rootModule+"/") {
				if mods[r.Mod.Path] == nil {
					return nil, "", fmt.Errorf("%s/go.mod requires %s, which is not a module of the repository outside tools/", m.dir, r.Mod.Path)
				}
				m.deps = append(m.deps, r.Mod.Path)
			}
		}
		sort.Strings(m.deps)
	}
	order, err := topoOrder(mods)
	if err != nil {
		return nil, "", err
	}

	// The tree at the tag, without .git, where the rewritten go.mod and
	// go.sum files are written and each module's zip is hashed.
	tree := filepath.Join(work, "tree")
	if err := c.export(ctx, tree); err != nil {
		return nil, "", err
	}
	var changed []string // slash paths rewritten
	for _, m := range order {
		modDir := filepath.Join(tree, filepath.FromSlash(m.dir))
		if m.dir != "." {
			gomod, err := resolveGoMod(m, mods, c.tag)
			if err != nil {
				return nil, "", err
			}
			m.gomod = gomod
			gosum, err := resolveGoSum(filepath.Join(modDir, "go.sum"), m, mods, c.tag)
			if err != nil {
				return nil, "", err
			}
			if err := os.WriteFile(filepath.Join(modDir, "go.mod"), gomod, 0o644); err != nil {
				return nil, "", err
			}
			if err := os.WriteFile(filepath.Join(modDir, "go.sum"), gosum, 0o644); err != nil {
				return nil, "", err
			}
			changed = append(changed, path.Join(m.dir, "go.mod"), path.Join(m.dir, "go.sum"))
		}
		if m.modHash, err = dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(m.gomod)), nil
		}); err != nil {
			return nil, "", err
		}
		zipPath := filepath.Join(work, "zips", strings.ReplaceAll(m.path, "/", "_")+".zip")
		if err := os.MkdirAll(filepath.Dir(zipPath), 0o755); err != nil {
			return nil, "", err
		}
		zf, err := os.Create(zipPath)
		if err != nil {
			return nil, "", err
		}
		err = modzip.CreateFromDir(zf, module.Version{Path: m.path, Version: c.tag}, modDir)
		zf.Close()
		if err != nil {
			return nil, "", fmt.Errorf("zip of %s: %w", m.path, err)
		}
		if m.zipHash, err = dirhash.HashZip(zipPath, dirhash.Hash1); err != nil {
			return nil, "", err
		}
	}

	releaseCommit, err := c.commitRelease(ctx, work, tree, changed, commitTime)
	if err != nil {
		return nil, "", err
	}
	for _, m := range order {
		if m.dir == "." {
			continue
		}
		if err := c.tagOnce(ctx, m.tagName(c.tag), releaseCommit); err != nil {
			return nil, "", err
		}
	}

	// The proxy's zips come from the tags, as a module proxy makes them
	// from a pushed tag; each must hash as the go.sum files say.
	proxy := filepath.Join(c.dist, "proxy")
	for _, m := range order {
		escaped, err := module.EscapePath(m.path)
		if err != nil {
			return nil, "", err
		}
		vdir := filepath.Join(proxy, filepath.FromSlash(escaped), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return nil, "", err
		}
		zipPath := filepath.Join(vdir, c.tag+".zip")
		zf, err := os.Create(zipPath)
		if err != nil {
			return nil, "", err
		}
		subdir := ""
		if m.dir != "." {
			subdir = m.dir
		}
		err = modzip.CreateFromVCS(zf, module.Version{Path: m.path, Version: c.tag}, c.repo, m.tagName(c.tag), subdir)
		zf.Close()
		if err != nil {
			return nil, "", fmt.Errorf("zip of %s from tag %s: %w", m.path, m.tagName(c.tag), err)
		}
		h, err := dirhash.HashZip(zipPath, dirhash.Hash1)
		if err != nil {
			return nil, "", err
		}
		if h != m.zipHash {
			return nil, "", fmt.Errorf("zip of %s from tag %s hashes %s, but the files at the release hash %s: does .gitattributes export-ignore files?", m.path, m.tagName(c.tag), h, m.zipHash)
		}
		info, _ := json.Marshal(struct {
			Version string
			Time    string
		}{c.tag, commitTime.Format(time.RFC3339)})
		for name, data := range map[string][]byte{
			"list":          []byte(c.tag + "\n"),
			c.tag + ".info": info,
			c.tag + ".mod":  m.gomod,
		} {
			if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
				return nil, "", err
			}
		}
	}
	return order, releaseCommit, nil
}

// topoOrder orders the modules so that each comes after those it requires.
func topoOrder(mods map[string]*releasedModule) ([]*releasedModule, error) {
	var names []string
	for p := range mods {
		names = append(names, p)
	}
	sort.Strings(names)
	state := map[string]int{} // 1 visiting, 2 done
	var order []*releasedModule
	var visit func(p string, stack []string) error
	visit = func(p string, stack []string) error {
		switch state[p] {
		case 1:
			return fmt.Errorf("the repository's modules require each other in a cycle: %s", strings.Join(append(stack, p), " → "))
		case 2:
			return nil
		}
		state[p] = 1
		for _, d := range mods[p].deps {
			if err := visit(d, append(stack, p)); err != nil {
				return err
			}
		}
		state[p] = 2
		order = append(order, mods[p])
		return nil
	}
	for _, p := range names {
		if err := visit(p, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// resolveGoMod rewrites m's go.mod: every requirement of a module of the
// repository at version, and no replace directive for them.
func resolveGoMod(m *releasedModule, mods map[string]*releasedModule, version string) ([]byte, error) {
	mf, err := modfile.Parse(m.dir+"/go.mod", m.gomod, nil)
	if err != nil {
		return nil, err
	}
	for _, d := range m.deps {
		if err := mf.AddRequire(d, version); err != nil {
			return nil, err
		}
	}
	for _, r := range append([]*modfile.Replace(nil), mf.Replace...) {
		if mods[r.Old.Path] == nil {
			continue
		}
		if err := mf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
			return nil, err
		}
	}
	mf.Cleanup()
	out, err := mf.Format()
	if err != nil {
		return nil, err
	}
	// The comment that explained the dropped replace block stays behind
	// with nothing under it; a released go.mod does without it.
	out = dropDanglingComment(out)
	return out, nil
}

// dropDanglingComment removes trailing comment lines that no directive
// follows.
func dropDanglingComment(gomod []byte) []byte {
	lines := strings.Split(strings.TrimRight(string(gomod), "\n"), "\n")
	for len(lines) > 0 {
		last := strings.TrimSpace(lines[len(lines)-1])
		if last != "" && !strings.HasPrefix(last, "//") {
			break
		}
		lines = lines[:len(lines)-1]
	}
	return []byte(strings.Join(lines, "\n") + "\n")
}

// resolveGoSum returns m's go.sum with the hashes of the repository's
// modules in its graph at the release.
func resolveGoSum(file string, m *releasedModule, mods map[string]*releasedModule, version string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || mods[f[0]] != nil {
			continue
		}
		lines = append(lines, l)
	}
	seen := map[string]bool{}
	var add func(p string)
	add = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		d := mods[p]
		lines = append(lines,
			fmt.Sprintf("%s %s %s", p, version, d.zipHash),
			fmt.Sprintf("%s %s/go.mod %s", p, version, d.modHash))
		for _, dd := range d.deps {
			add(dd)
		}
	}
	for _, d := range m.deps {
		add(d)
	}
	sort.Strings(lines)
	return []byte(strings.Join(lines, "\n") + "\n"), nil
}

// export writes the tree at the tag into dir.
func (c *config) export(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	archive := exec.CommandContext(ctx, "git", "-C", c.repo, "archive", "--format=tar", c.tag)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var stderr bytes.Buffer
	archive.Stderr, untar.Stderr = &stderr, &stderr
	if err := archive.Start(); err != nil {
		return err
	}
	if err := untar.Run(); err != nil {
		archive.Wait()
		return fmt.Errorf("git archive %s | tar -x: %v: %s", c.tag, err, stderr.String())
	}
	if err := archive.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %v: %s", c.tag, err, stderr.String())
	}
	return nil
}

// commitRelease commits the rewritten files on top of the tag, without
// touching the repository's work tree, index or HEAD. Author, committer and
// dates are the tag's commit's, so the same tag always gives the same
// release commit.
func (c *config) commitRelease(ctx context.Context, work, tree string, changed []string, commitTime time.Time) (string, error) {
	index := []string{"GIT_INDEX_FILE=" + filepath.Join(work, "index")}
	if _, err := c.git(ctx, index, "read-tree", c.tag); err != nil {
		return "", err
	}
	for _, f := range changed {
		blob, err := c.git(ctx, nil, "hash-object", "-w", "--", filepath.Join(tree, filepath.FromSlash(f)))
		if err != nil {
			return "", err
		}
		if _, err := c.git(ctx, index, "update-index", "--add", "--cacheinfo", "100644,"+blob+","+f); err != nil {
			return "", err
		}
	}
	treeID, err := c.git(ctx, index, "write-tree")
	if err != nil {
		return "", err
	}
	who, err := c.git(ctx, nil, "show", "-s", "--format=%cn%n%ce", c.tag+"^{commit}")
	if err != nil {
		return "", err
	}
	name, email, _ := strings.Cut(who, "\n")
	date := commitTime.Format(time.RFC3339)
	env := []string{
		"GIT_AUTHOR_NAME=" + name, "GIT_AUTHOR_EMAIL=" + email, "GIT_AUTHOR_DATE=" + date,
		"GIT_COMMITTER_NAME=" + name, "GIT_COMMITTER_EMAIL=" + email, "GIT_COMMITTER_DATE=" + date,
	}
	msg := fmt.Sprintf("release %s: the modules of the repository require each other at %s, without replace directives", c.tag, c.tag)
	return c.git(ctx, env, "-c", "commit.gpgsign=false", "commit-tree", treeID, "-p", c.tag+"^{commit}", "-m", msg)
}

// tagOnce makes tag at commit, or checks that it is there already.
func (c *config) tagOnce(ctx context.Context, tag, commit string) error {
	if at, err := c.git(ctx, nil, "rev-parse", "--verify", "--quiet", tag+"^{commit}"); err == nil {
		if at != commit {
			return fmt.Errorf("tag %s exists at %.12s, not at the release commit %.12s: delete it (git tag -d %s) if it is left from an earlier try", tag, at, commit, tag)
		}
		return nil
	}
	_, err := c.git(ctx, nil, "tag", tag, commit)
	return err
}
