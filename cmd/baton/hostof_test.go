package main

import (
	"testing"

	"github.com/batonhq/baton"
)

func TestHostOf(t *testing.T) {
	a, b := baton.NewCandidateID(), baton.NewCandidateID()
	if hostOf(a) != hostOf(b) || hostOf(a) == "" {
		t.Errorf("hostOf(%q) = %q, hostOf(%q) = %q", a, hostOf(a), b, hostOf(b))
	}
	if hostOf("plain") != "plain" {
		t.Errorf("hostOf of an ID without a slash must be the ID itself")
	}
}
