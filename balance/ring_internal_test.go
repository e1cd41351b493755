package balance

import (
	"fmt"
	"slices"
	"testing"
)

// TestRingSpreadsSimilarNames: lease names that differ only in their last
// characters ("job-0000" … "job-9999", what groups of leases are named),
// and the points of one member ("ID#0" … "ID#15"), land all round the
// standby ring, so that every member of 100 stands by for about 3 % of
// 10,000 leases and shares leases' ring members with many others. Each
// member's share of standby duty must be within a factor of 2 of the mean
// (300): an FNV hash alone puts the 16 points of a member at two places,
// and each group of 10 names at one, so that some members stand by for
// none and others for 860.
func TestRingSpreadsSimilarNames(t *testing.T) {
	members := map[string]struct{}{}
	for i := range 100 {
		members[fmt.Sprintf("i%03d", i)] = struct{}{}
	}
	g := &Group{members: members, ring: newRing(members)}
	duty := map[string]int{}
	for i := range 10000 {
		for _, id := range g.ringMembersLocked(fmt.Sprintf("job-%04d", i)) {
			duty[id]++
		}
	}
	var counts []int
	for id := range members {
		counts = append(counts, duty[id])
	}
	slices.Sort(counts)
	lo, hi := counts[0], counts[len(counts)-1]
	t.Logf("standby duty per member: %d to %d leases, median %d", lo, hi, counts[len(counts)/2])
	if lo < 150 || hi > 600 {
		t.Fatalf("standby duty per member ranges %d to %d leases (mean 300); want every member within 150 to 600", lo, hi)
	}
	// The points of one member: 16 distinct places, not a few.
	places := map[uint64]bool{}
	for i := range ringPoints {
		places[hash64(fmt.Sprintf("i007#%d", i))>>54] = true // which of 1,024 arcs
	}
	if len(places) < ringPoints/2 {
		t.Fatalf("a member's %d points fall in %d of 1,024 arcs of the ring; want them spread", ringPoints, len(places))
	}
}
