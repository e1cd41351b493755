// Command release makes a baton release from a clean checkout at a tag.
//
//	git tag v1.2.3
//	cd tools/release && GOWORK=off go run . -repo ../.. -tag v1.2.3
//
// (tools/release is a module of its own, outside the repository's go.work.)
//
// It fills dist/ with:
//
//   - proxy/: every module of the repository (outside tools/) at the tag's
//     version, as a GOPROXY=file://… directory (@v/list, .info, .mod, .zip).
//     The nested modules' go.mod files name each other at that version
//     instead of through replace directives, so that
//     `go install github.com/batonhq/baton/cmd/baton@v1.2.3` works. Those
//     go.mod and go.sum files are committed on a release commit on top of
//     the tag (the root module's tag stays where it is: its zip is the same
//     from either commit, since nested modules are not part of it), and the
//     nested modules' tags (aws/v1.2.3, backend/etcd/v1.2.3, …) are made on
//     it in the local repository: pushing them publishes what proxy/ holds.
//   - baton_1.2.3_OS_ARCH.tar.gz for each -platforms entry (linux and
//     darwin, amd64 and arm64): the binary that
//     `go install …/cmd/baton@v1.2.3` builds from proxy/, with -trimpath,
//     symbols stripped (-s -w) and the tag's commit stamped in, so that
//     `baton version` prints the version and the commit; beside each, its
//     CycloneDX SBOM (baton_1.2.3_OS_ARCH.sbom.cdx.json). The darwin
//     binaries run the guard in its process-group mode (docs/guarantees.md:
//     for development on a Mac, not for production).
//   - oci/: an OCI image layout holding one image index with an image per
//     linux platform: the binary and the build machine's CA certificates,
//     run as user 65532.
//   - baton_1.2.3_ARCH.deb for each linux platform: the binary, the systemd
//     units of deploy/systemd/ and its default environment file.
//   - checksums.txt: the SHA-256 of every archive, SBOM and package.
//
// Exit status: 0 done, 1 the release failed, 2 bad flags or a tree that
// cannot be released (dirty, HEAD not at the tag).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

// defaultPlatforms are the release's targets.
const defaultPlatforms = "linux/amd64,linux/arm64,darwin/amd64,darwin/arm64"

// usageError is a problem with the flags or the tree: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := runMain(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		var ue *usageError
		if errors.As(err, &ue) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func runMain(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.repo, "repo", ".", "the repository's root (a clean checkout whose HEAD is at -tag)")
	fs.StringVar(&c.tag, "tag", "", "the version to release, a semantic version tag such as v1.2.3 (required)")
	fs.StringVar(&c.dist, "dist", "", "the output directory (default REPO/dist); it must not exist or be empty")
	platforms := fs.String("platforms", defaultPlatforms, "GOOS/GOARCH pairs to build, comma-separated; images and packages are made for the linux ones")
	if err := fs.Parse(args); err != nil {
		return &usageError{err.Error()}
	}
	if fs.NArg() != 0 {
		return &usageError{fmt.Sprintf("unexpected arguments %q: release takes flags only", fs.Args())}
	}
	for _, p := range strings.Split(*platforms, ",") {
		pl, err := parsePlatform(strings.TrimSpace(p))
		if err != nil {
			return &usageError{err.Error()}
		}
		c.platforms = append(c.platforms, pl)
	}
	c.log = stderr
	_, err := c.run(ctx)
	return err
}
