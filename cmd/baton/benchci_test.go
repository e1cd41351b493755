package main

import (
	"testing"

	"github.com/batonhq/baton/internal/benchci"
)

// TestBenchmarks runs every benchmark of the package once, as a test that
// it still works; see package internal/benchci.
func TestBenchmarks(t *testing.T) { benchci.Run(t) }

var _ = benchci.Register(BenchmarkAWSHandOver, "handover-ms>=0", "notice-to-complete-ms>0")
