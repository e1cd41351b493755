package unwired

import "testing"

// BenchmarkWired is registered by the test that reads this directory.
func BenchmarkWired(b *testing.B) {}

// BenchmarkForgotten is not: CheckRegistered must name it.
func BenchmarkForgotten(b *testing.B) {}

// Benchmarkhelper is no benchmark to `go test` (lower case after the prefix).
func Benchmarkhelper(b *testing.B) {}

// BenchmarkTwoArgs is no benchmark either.
func BenchmarkTwoArgs(b *testing.B, n int) {}
