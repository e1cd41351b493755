package main

// Deliberately broken builds, for the chaos harness to prove that its
// checker can fail (`baton-chaos --broken NAME` builds baton with the tag).
// A normal build sets neither switch; the tagged files set one each.
var (
	// brokenIgnoreDeadline (tag batonchaos_ignoredeadline) makes run's
	// guard ignore the term's safe-until: the command goes on when this
	// process stops extending it (a frozen holder), as a runner without a
	// guard would.
	brokenIgnoreDeadline bool
	// brokenStaleToken (tag batonchaos_staletoken) hands every second
	// term's command a token from an earlier epoch, lower than the term's
	// own, as a backend that hands out stale tokens would.
	brokenStaleToken bool
)
