//go:build !race

package kubernetes_test

// raceEnabled says the tests were built with -race: the programs they
// build are too, so that they share the build cache's packages.
const raceEnabled = false
