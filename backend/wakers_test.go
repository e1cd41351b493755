package backend

import "testing"

// A wake-up reaches the set it names and only that set's channels for
// that name; many wake-ups merge into one; WakeAll reaches both sets; a
// cancelled subscription receives nothing more.
func TestWakers(t *testing.T) {
	var w Wakers
	camp, cancelCamp := w.Subscribe("a", true)
	watch, cancelWatch := w.Subscribe("a", false)
	other, cancelOther := w.Subscribe("b", true)
	defer cancelOther()
	pending := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	if !w.Wake("a", true) || !w.Wake("a", true) {
		t.Fatal("Wake of a's campaigns found none")
	}
	if !pending(camp) || pending(camp) || pending(watch) || pending(other) {
		t.Fatal("two wake-ups of a's campaigns did not reach its campaign once, and only it")
	}
	if w.Wake("c", false) {
		t.Error("Wake of a name nobody waits on reported a waiter")
	}
	w.WakeAll()
	if !pending(camp) || !pending(watch) || !pending(other) {
		t.Error("WakeAll missed a channel")
	}
	cancelCamp()
	cancelWatch()
	if w.Wake("a", true) || w.Wake("a", false) {
		t.Error("a cancelled subscription was still woken")
	}
}
