package schedule_test

import (
	"testing"
	"time"

	"github.com/batonhq/baton/schedule"
)

// FuzzParse: no spec makes Parse panic, and an accepted spec fires.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"0 3 * * *", "*/10 * * * * *", "@daily", "@every 90s", "CRON_TZ=Europe/Berlin 30 6 * * 1-5",
		"CRON_TZ=UTC", "TZ=", "@every", "0 0 30 2 *", "* * * * * * *", "1-5/0 * * * *", "?"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		s, err := schedule.Parse(spec)
		if err != nil {
			return
		}
		if s.Next(time.Now()).IsZero() {
			t.Errorf("Parse(%q) accepted a spec that never fires", spec)
		}
		_ = schedule.CheckJitter(s, time.Second)
	})
}
