//go:build linux || darwin

package supervise_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/batonhq/baton/supervise"
)

// A command run for one term: its deadline is the term's SafeUntil, moved
// on with Extend after each renewal, and Stop before the term is given up.
// (The program's main, here TestMain, calls supervise.GuardMain first.)
func ExampleStart() {
	safeUntil := time.Now().Add(10 * time.Second) // a baton.Term's SafeUntil()
	p, err := supervise.Start(supervise.Config{
		Command:  []string{"echo", "leading"},
		Stdout:   os.Stdout,
		Grace:    2 * time.Second,
		Deadline: safeUntil,
	})
	if err != nil {
		log.Fatal(err)
	}
	// After each confirmed renewal: p.Extend(term.SafeUntil())
	<-p.Done()
	// Stop also ends whatever the command left running.
	if err := p.Stop(context.Background()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", p.ExitCode())
	// Output:
	// leading
	// exit code 0
}
