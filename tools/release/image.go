package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's files and user.
const (
	imageBinary = "/usr/local/bin/baton"
	imageCAFile = "/etc/ssl/certs/ca-certificates.crt"
	// imageUser is distroless's "nonroot", which deploy/kubernetes's
	// securityContext names too.
	imageUser = "65532:65532"
	// hostCAFile is where Debian's ca-certificates package puts the bundle.
	hostCAFile = "/etc/ssl/certs/ca-certificates.crt"
)

// imageSource is where the image says it was built from.
const imageSource = "https://github.com/batonhq/baton"

// layerFile is one regular file of a layer.
type layerFile struct {
	name string // absolute path in the image
	data []byte
	mode int64
}

// tarLayer makes a layer of files and their parent directories, owned by
// root and dated mtime.
func tarLayer(files []layerFile, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(strings.TrimPrefix(f.name, "/")); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(f.name, "/"), Typeflag: tar.TypeReg, Mode: f.mode, Size: int64(len(f.data)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
}

// image writes dist/oci, an OCI image layout whose index.json names one
// image index (tagged with the version) holding an image per linux
// platform: a layer of CA certificates, shared by all platforms, and a
// layer with the binary. The image runs baton as user 65532.
func (c *config) image(linux []platform, binaries map[platform]string, commit string, mtime time.Time) (string, error) {
	ca, err := os.ReadFile(hostCAFile)
	if err != nil {
		return "", fmt.Errorf("the image's CA certificates: %v (install Debian's ca-certificates package)", err)
	}
	caLayer, err := tarLayer([]layerFile{{imageCAFile, ca, 0o644}}, mtime)
	if err != nil {
		return "", err
	}
	labels := map[string]string{
		"org.opencontainers.image.title":    "baton",
		"org.opencontainers.image.version":  c.tag,
		"org.opencontainers.image.revision": commit,
		"org.opencontainers.image.source":   imageSource,
		"org.opencontainers.image.created":  mtime.Format(time.RFC3339),
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range linux {
		binary, err := os.ReadFile(binaries[p])
		if err != nil {
			return "", err
		}
		binLayer, err := tarLayer([]layerFile{{imageBinary, binary, 0o755}}, mtime)
		if err != nil {
			return "", err
		}
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		img, err = mutate.Append(img,
			mutate.Addendum{Layer: caLayer, History: v1.History{Created: v1.Time{Time: mtime}, CreatedBy: "CA certificates (" + hostCAFile + " of the build machine)"}},
			mutate.Addendum{Layer: binLayer, History: v1.History{Created: v1.Time{Time: mtime}, CreatedBy: "baton " + c.tag + " (" + c.archiveName(p) + ")"}})
		if err != nil {
			return "", err
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return "", err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = p.os, p.arch
		cf.Created = v1.Time{Time: mtime}
		cf.Config.User = imageUser
		cf.Config.Entrypoint = []string{imageBinary}
		cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "SSL_CERT_FILE=" + imageCAFile}
		cf.Config.WorkingDir = "/"
		cf.Config.Labels = labels
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return "", err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: p.os, Architecture: p.arch}},
		})
	}
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	dir := filepath.Join(c.dist, "oci")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": c.version(),
	})); err != nil {
		return "", err
	}
	return dir, nil
}
