package schedule

// LatestBefore exposes latestBefore to the tests.
var LatestBefore = latestBefore
