package main

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/CycloneDX/cyclonedx-gomod/pkg/generate/bin"
	"github.com/rs/zerolog"
)

// archiveName is the archive of one platform's binary.
func (c *config) archiveName(p platform) string {
	return fmt.Sprintf("baton_%s_%s_%s.tar.gz", c.version(), p.os, p.arch)
}

// archive writes baton_VERSION_OS_ARCH.tar.gz: the binary and the README,
// at the archive's top level, owned by root, dated at the commit, so that
// the same tag gives the same bytes.
func (c *config) archive(p platform, binPath string, mtime time.Time) (string, error) {
	out := filepath.Join(c.dist, c.archiveName(p))
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	gz, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(gz)
	for _, e := range []struct {
		name, src string
		mode      int64
	}{
		{"baton", binPath, 0o755},
		{"README.md", filepath.Join(c.repo, "README.md"), 0o644},
	} {
		data, err := os.ReadFile(e.src)
		if err != nil {
			return "", err
		}
		hdr := &tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(data)), ModTime: mtime, Typeflag: tar.TypeReg, Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", err
		}
		if _, err := tw.Write(data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	if err := gz.Close(); err != nil {
		return "", err
	}
	return out, f.Close()
}

// sbom writes the CycloneDX SBOM of p's binary beside its archive: the
// modules compiled into it (from its build information, which is what the
// binary carries, not what go.mod lists) and the Go standard library.
func (c *config) sbom(p platform, binPath string) (string, error) {
	g, err := bin.NewGenerator(binPath,
		bin.WithLogger(zerolog.Nop()),
		bin.WithIncludeStdlib(true))
	if err != nil {
		return "", err
	}
	bom, err := g.Generate()
	if err != nil {
		return "", fmt.Errorf("SBOM of the %s binary: %w", p, err)
	}
	out := filepath.Join(c.dist, fmt.Sprintf("baton_%s_%s_%s.sbom.cdx.json", c.version(), p.os, p.arch))
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	defer f.Close()
	enc := cdx.NewBOMEncoder(f, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		return "", err
	}
	return out, f.Close()
}
