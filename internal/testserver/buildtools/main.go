// Command buildtools builds every program the tests run from the tools
// modules (see tools/README.md) into the user cache, where the tests find
// them, and prints their paths. .ci/run calls it before the tests so that a
// cold build is not charged to any one test; a warm cache makes it a no-op.
//
//	go run ./internal/testserver/buildtools
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/batonhq/baton/internal/testserver"
)

func main() {
	failed := false
	for _, tool := range testserver.Tools {
		start := time.Now()
		bin, err := tool.Binary()
		if err != nil {
			fmt.Fprintf(os.Stderr, "buildtools: %s %s: %v\n%s\n", tool.Name, tool.Version, err, tool.Hint())
			failed = true
			continue
		}
		fmt.Printf("%s %s: %s (%s)\n", tool.Name, tool.Version, bin, time.Since(start).Round(time.Millisecond))
	}
	if failed {
		os.Exit(1)
	}
}
