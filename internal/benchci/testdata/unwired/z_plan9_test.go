package unwired

import "testing"

// BenchmarkPlan9 is in Plan 9's build only.
func BenchmarkPlan9(b *testing.B) {}
