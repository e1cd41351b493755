package backend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

// What a program that holds a BasicTerm without an Elector sees of a
// requested resign: a closed ResignRequested channel, the term still
// running, and the request's reason once it resigns.
func TestBasicTermRequestResign(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		released := 0
		term := backend.NewBasicTerm("job", 1, time.Now().Add(time.Minute), func(context.Context) error { released++; return nil })
		if baton.ResignRequestedOf(term) == nil {
			t.Fatal("ResignRequestedOf(BasicTerm) is nil")
		}
		select {
		case <-term.ResignRequested():
			t.Fatal("ResignRequested closed before any request")
		default:
		}
		reason := fmt.Errorf("%w: asked", baton.ErrResigned)
		if !term.RequestResign(reason) || term.RequestResign(reason) {
			t.Fatal("RequestResign: want true once, then false")
		}
		<-term.ResignRequested()
		select {
		case <-term.Done():
			t.Fatal("a requested resign ended the term")
		default:
		}
		if term.Err() != nil || released != 0 {
			t.Fatalf("after the request: Err %v, released %d times; want a running, unreleased term", term.Err(), released)
		}
		if err := term.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(term.Err(), baton.ErrResigned) || term.Err() != reason || released != 1 {
			t.Fatalf("after Resign: Err %v, released %d times", term.Err(), released)
		}
		ended := backend.NewBasicTerm("job", 2, time.Now().Add(time.Minute), nil)
		ended.End(baton.ErrLeaseLost)
		if ended.RequestResign(reason) {
			t.Error("RequestResign of an ended term reported a request")
		}
		if baton.ResignRequestedOf(fakeTerm{}) != nil {
			t.Error("ResignRequestedOf a Term without requests is not nil")
		}
	})
}

// fakeTerm is a Term of a backend that relays no resign requests.
type fakeTerm struct{ baton.Term }
