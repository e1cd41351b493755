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

// buildVersion is versionText of this binary.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	return versionText(bi, ok)
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
