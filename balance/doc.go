// Package balance runs many named leases in each instance of a service and
// spreads their leadership over the instances, so that no instance leads much
// more than its fair share: ceil(leases / instances).
//
// # What is guaranteed, and what is not
//
// Balance never weakens baton's safety model. Every lease is an ordinary
// baton lease: one holder at a time, fencing tokens that strictly increase,
// and a callback whose context ends at the term's safe-until deadline (or
// StopEarly before it, with the Elector's cause). This package only decides
// when an instance campaigns for a lease, whether it keeps one it has won,
// and when it gives one up; it never runs a callback without a live term.
//
// Liveness: every lease held by an instance has two or three standbys
// (the members next to the lease's name on a hash ring, see
// docs/balance.md) with a campaign open for it, which notice a holder that
// dies or resigns; and whenever the loads the members publish do not
// account for every lease, the instances below their share read the
// leases they do not lead (a sample sized to what they lack) and
// campaign, after a short load-dependent delay, for one they see without
// a live holder; so a lease whose holder dies or resigns is taken over as
// long as one instance can reach the backend.
//
// The balance bound: with L leases over N instances, once N has been
// stable for about one TTL plus two RefreshIntervals, every instance runs
// the same set of leases and can reach the backend, every instance leads floor(L/N) or
// ceil(L/N) leases, within the promised bound of ceil(L/N) + 1, and stays
// there. Every decision uses a view up to RefreshInterval old, and while N
// changes the bound holds only approximately, for about one TTL plus
// ShedAfter after a crash. Not guaranteed: which instance leads which lease,
// or that a lease stays put: balancing moves leases, gracefully (the callback
// returns before the lease is released). A crashed holder's lease fails over
// after TTL + Delay (+ a refresh at worst) when every instance leads its
// share.
//
// How instances count each other (member slots), publish their loads
// (load slots), choose whether to campaign, shed, and what it costs in
// backend requests:
// docs/balance.md.
//
// # Using it
//
//	g, err := balance.New(backend, balance.Config{Group: "reports"})
//	...
//	for _, name := range []string{"report-eu", "report-us", "report-ap"} {
//		g.Add(name, func(ctx context.Context, t baton.Term) error {
//			return runReport(ctx, t.Lease(), t.Token()) // stop when ctx ends
//		})
//	}
//	err = g.Run(ctx) // until ctx ends; resigns everything on the way out
package balance
