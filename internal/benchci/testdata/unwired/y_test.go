//go:build never

package unwired

import "testing"

// BenchmarkExcluded is in no build: it need not be registered.
func BenchmarkExcluded(b *testing.B) {}
