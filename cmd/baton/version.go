package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// versionText describes the build from its embedded build information: the
// module version (a release tag, or Go's pseudo-version of the commit), the
// VCS commit with its time and whether the tree had uncommitted changes,
// and the Go toolchain. A binary built from a checkout without a tag reports
// version "(devel)"; one built without VCS stamping (-buildvcs=false, or
// outside a checkout) says that it cannot name its commit.
func versionText(bi *debug.BuildInfo, ok bool) string {
	var b strings.Builder
	if !ok || bi == nil {
		fmt.Fprintf(&b, "baton (unknown version: this binary carries no build information)\n")
		fmt.Fprintf(&b, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return b.String()
	}
	version := bi.Main.Version
	if version == "" || version == "(devel)" {
		version = "(devel): built from a source tree, not a released module"
	}
	fmt.Fprintf(&b, "baton %s\n", version)
	var rev, at string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	switch {
	case rev == "":
		fmt.Fprintf(&b, "commit: unknown (built without version control information)\n")
	default:
		line := "commit: " + rev
		if at != "" {
			line += " (" + at + ")"
		}
		if modified {
			line += ", dirty: the tree had uncommitted changes"
		}
		fmt.Fprintln(&b, line)
	}
	fmt.Fprintf(&b, "go: %s %s/%s\n", bi.GoVersion, runtime.GOOS, runtime.GOARCH)
	return b.String()
}

// releaseCommit and releaseCommitTime (RFC 3339) name the commit a
// release binary was built from. tools/release sets them with -ldflags -X:
// it builds with go install from the release's module zips, which carry no
// version control information, so the build information names the module
// version but not the commit.
var releaseCommit, releaseCommitTime string

// buildVersion is versionText of this binary.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	return versionText(withReleaseCommit(bi, releaseCommit, releaseCommitTime), ok)
}

// withReleaseCommit returns bi with commit and at as its VCS settings when
// bi has none of its own and commit is set.
func withReleaseCommit(bi *debug.BuildInfo, commit, at string) *debug.BuildInfo {
	if bi == nil || commit == "" {
		return bi
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return bi
		}
	}
	c := *bi
	c.Settings = append(append([]debug.BuildSetting(nil), bi.Settings...), debug.BuildSetting{Key: "vcs.revision", Value: commit})
	if at != "" {
		c.Settings = append(c.Settings, debug.BuildSetting{Key: "vcs.time", Value: at})
	}
	return &c
}

func (a *App) newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print baton's version and the commit it was built from",
		Long:  "Print baton's module version, the VCS commit it was built from (with \"dirty\" when\nthe tree had uncommitted changes) and the Go toolchain. Same as baton --version.",
		Args:  noArgs,
		RunE: wrapRunE(func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprint(a.stdout(), buildVersion())
			return err
		}),
	}
}
