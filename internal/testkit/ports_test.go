package testkit

import "testing"

// Ports handed out one after the other are all distinct, though each
// listener is closed before the next is asked for.
func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 500 {
		p, err := FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
