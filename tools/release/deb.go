package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
)

// The package's files, and where in the repository they come from.
var debUnits = []string{"baton.service", "baton-agent.service"}

const (
	debUnitDir    = "/lib/systemd/system"
	debBinary     = "/usr/bin/baton"
	debSystemdSrc = "deploy/systemd"
	debEnvSrc     = "deploy/systemd/baton.env"
	// debEnvDefault is where the environment file goes when baton.service
	// names no EnvironmentFile.
	debEnvDefault = "/etc/default/baton"
)

// debEnvFile returns where the package installs deploy/systemd/baton.env:
// the first absolute EnvironmentFile that baton.service names (its "-"
// prefix, which makes the file optional, aside), so the unit and the
// package cannot disagree.
func debEnvFile(unit []byte) string {
	for _, line := range strings.Split(string(unit), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok || strings.TrimSpace(k) != "EnvironmentFile" {
			continue
		}
		v = strings.TrimPrefix(strings.TrimSpace(v), "-")
		if strings.HasPrefix(v, "/") && !strings.ContainsAny(v, " \t%") {
			return v
		}
	}
	return debEnvDefault
}

// debReload runs after install and after removal: systemd rereads its
// units when it is the running init and the package is installed into
// this system (not into another root, where DPKG_ROOT is set). The units
// are not enabled or started: a baton service needs its backend and lease
// named in their environment file first.
const debReload = `#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null || true
fi
`

// deb writes baton_VERSION_ARCH.deb for linux platform p.
func (c *config) deb(p platform, binPath string, mtime time.Time) (string, error) {
	scripts, err := os.MkdirTemp("", "baton-deb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(scripts)
	reload := filepath.Join(scripts, "reload.sh")
	if err := os.WriteFile(reload, []byte(debReload), 0o755); err != nil {
		return "", err
	}
	unit, err := os.ReadFile(filepath.Join(c.repo, filepath.FromSlash(debSystemdSrc), debUnits[0]))
	if err != nil {
		return "", fmt.Errorf("the package's systemd unit: %v", err)
	}
	contents := files.Contents{
		{Source: binPath, Destination: debBinary, FileInfo: &files.ContentFileInfo{Mode: 0o755, MTime: mtime}},
		{Source: filepath.Join(c.repo, filepath.FromSlash(debEnvSrc)), Destination: debEnvFile(unit), Type: files.TypeConfigNoReplace, FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}},
	}
	for _, u := range debUnits {
		src := filepath.Join(c.repo, filepath.FromSlash(debSystemdSrc), u)
		if _, err := os.Stat(src); err != nil {
			return "", fmt.Errorf("the package's systemd unit: %v", err)
		}
		contents = append(contents, &files.Content{Source: src, Destination: debUnitDir + "/" + u, FileInfo: &files.ContentFileInfo{Mode: 0o644, MTime: mtime}})
	}
	info := nfpm.WithDefaults(&nfpm.Info{
		Name:        "baton",
		Arch:        p.arch,
		Platform:    "linux",
		Version:     c.tag,
		Section:     "admin",
		Priority:    "optional",
		Maintainer:  "baton maintainers <baton@batonhq.invalid>",
		Description: "leader election for services: run work on one instance at a time\nbaton lets several instances of a service agree on one leader, runs\nleader-only work (a child process, a cron job) only while it leads, and\nhands over when the leader dies, hangs or shuts down. The package holds\nthe baton command, systemd units for baton run and baton agent, and\ntheir environment file.",
		Homepage:    imageSource,
		MTime:       mtime,
		Overridables: nfpm.Overridables{
			Contents: contents,
			Scripts:  nfpm.Scripts{PostInstall: reload, PostRemove: reload},
		},
	})
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", fmt.Errorf("Debian package for %s: %w", p, err)
	}
	pkgr, err := nfpm.Get("deb")
	if err != nil {
		return "", err
	}
	out := filepath.Join(c.dist, pkgr.ConventionalFileName(info))
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := pkgr.Package(info, f); err != nil {
		return "", fmt.Errorf("Debian package for %s: %w", p, err)
	}
	return out, f.Close()
}
