package main

import (
	"strings"

	"github.com/spf13/cobra"
)

// missingDash returns a usage error explaining err, a flag parsing error of
// run or cron, when the unknown flag came after the first word of the
// command to run with no -- before it (baton run --backend URL sh -c 'x'):
// the flag is the command's, and baton read it as its own. Otherwise nil.
func missingDash(cmd *cobra.Command, err error) error {
	if cmd.Name() != "run" && cmd.Name() != "cron" {
		return nil
	}
	// pflag keeps the words that are not flags, read so far, as the
	// command's arguments: here, the command given without --.
	words := cmd.Flags().Args()
	if len(words) == 0 || cmd.ArgsLenAtDash() >= 0 {
		return nil
	}
	msg := err.Error()
	if !strings.Contains(msg, "unknown flag") && !strings.Contains(msg, "unknown shorthand flag") {
		return nil
	}
	return usageErrorf("%v: it belongs to the command to run (%s), not to baton: put -- before the command, as in: %s [flags] -- %s ...",
		err, strings.Join(words, " "), cmd.CommandPath(), strings.Join(words, " "))
}
