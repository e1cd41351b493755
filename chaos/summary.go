package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batonhq/baton/chaos/internal/check"
)

// writeSummary writes the report's figures for a person: the verdict, the
// safety counts, availability, and recovery by fault kind.
func writeSummary(w io.Writer, r check.Report) {
	verdict := "PASSED"
	if !r.OK() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "%s: %s, seed %d, %d faults in %s, %d terms, %d writes\n",
		verdict, r.Backend, r.Seed, r.Faults, r.Duration.Round(time.Second), r.Terms, r.Writes)
	for _, f := range r.Failures() {
		fmt.Fprintf(w, "  failure: %s\n", f)
	}
	fmt.Fprintf(w, "fencing violations       %d (stale writes refused: %d)\n", r.Fencing.Violations, r.Fencing.StaleRefused)
	fmt.Fprintf(w, "token regressions        %d (over %d terms)\n", r.Tokens.Regressions, r.Tokens.Accepted)
	fmt.Fprintf(w, "overlaps                 %d outside the paused case; %d paused (%s)\n",
		r.Overlaps.Unexplained, r.Overlaps.Paused, r.Overlaps.PausedTime.Round(time.Millisecond))
	fmt.Fprintf(w, "availability             %.5f outside fault windows (%s of %s); %.4f overall\n",
		r.Availability.Fraction, r.Availability.LeaderlessTime.Round(time.Millisecond),
		r.Availability.Outside.Round(time.Second), r.Availability.Overall)
	if len(r.Exits) > 0 {
		fmt.Fprintf(w, "exits no fault caused     %d (restarted; see the candidates' logs): %s\n", len(r.Exits), strings.Join(r.Exits[:min(len(r.Exits), 5)], "; "))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kind\tfaults\tinterrupted\trecovery p50\tp90\tp99\tmax\thand-over p50\tp99\t")
	kinds := make([]string, 0, len(r.Recovery))
	for k := range r.Recovery {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	for _, k := range kinds {
		kr := r.Recovery[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", k, kr.Faults, kr.Interrupted,
			ms(kr.Recovery.P50), ms(kr.Recovery.P90), ms(kr.Recovery.P99), ms(kr.Recovery.Max),
			ms(kr.HandOver.P50), ms(kr.HandOver.P99))
	}
	_ = tw.Flush()
	if r.Command != "" {
		fmt.Fprintf(w, "reproduce: %s\n", strings.TrimSpace(r.Command))
	}
}
