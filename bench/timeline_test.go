package bench

import "testing"

func TestTimelineCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		evs     []leaderEvent
		changes int
		bad     bool
	}{
		{"one holder", []leaderEvent{{1, true, "a"}}, 0, false},
		{"hand-over", []leaderEvent{{1, true, "a"}, {5, false, "a"}, {6, true, "b"}}, 1, false},
		{"back again, out of order", []leaderEvent{{6, true, "b"}, {1, true, "a"}, {5, false, "a"}, {8, false, "b"}, {9, true, "a"}}, 2, false},
		{"overlap", []leaderEvent{{1, true, "a"}, {6, true, "b"}, {7, false, "a"}}, 0, true},
		{"nobody at the end", []leaderEvent{{1, true, "a"}, {5, false, "a"}}, 0, true},
	} {
		var tl timeline
		for _, ev := range tc.evs {
			tl.add(ev)
		}
		changes, err := tl.check()
		if (err != nil) != tc.bad || (!tc.bad && changes != tc.changes) {
			t.Errorf("%s: check() = %d, %v; want %d changes, error %v", tc.name, changes, err, tc.changes, tc.bad)
		}
	}
}
