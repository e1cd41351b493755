package backend_test

import (
	"errors"
	"testing"
	"time"

	"github.com/batonhq/baton"
	"github.com/batonhq/baton/backend"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	c, err := backend.Config{}.WithDefaults()
	if err != nil || c.TTL != 10*time.Second || c.RenewInterval != c.TTL/3 || c.DriftMargin != time.Second {
		t.Errorf("defaults = %+v, %v", c, err)
	}
	for _, bad := range []backend.Config{
		{TTL: -1},
		{TTL: time.Second, RenewInterval: time.Second},
		{TTL: time.Second, DriftMargin: 2 * time.Second},
	} {
		if _, err := bad.WithDefaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	_, err = backend.Config{TTL: -1, RenewInterval: -1, DriftMargin: -1}.WithDefaults()
	var ce *baton.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Errorf("err = %v; want all three problems at once", err)
	}
}

// A TTL from a server's reply above the client's own counts as the
// client's: no reply stretches safe-until past the send time + TTL −
// DriftMargin; a shorter one shortens it.
func TestSafeUntilBelievesNoLongerTTL(t *testing.T) {
	c, err := backend.Config{TTL: 2 * time.Second}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if got, want := c.SafeUntil(sent, 10*time.Hour), sent.Add(c.TTL-c.DriftMargin); !got.Equal(want) {
		t.Errorf("SafeUntil with a ten-hour TTL = send + %s, want send + %s", got.Sub(sent), want.Sub(sent))
	}
	if got, want := c.SafeUntil(sent, time.Second), sent.Add(time.Second-c.DriftMargin); !got.Equal(want) {
		t.Errorf("SafeUntil with a shorter TTL = send + %s, want send + %s", got.Sub(sent), want.Sub(sent))
	}
	if got, want := c.CapSafeUntil(sent, sent.Add(time.Hour)), sent.Add(c.TTL-c.DriftMargin); !got.Equal(want) {
		t.Errorf("CapSafeUntil of an hour = send + %s, want send + %s", got.Sub(sent), want.Sub(sent))
	}
	if early := sent.Add(time.Second); !c.CapSafeUntil(sent, early).Equal(early) {
		t.Error("CapSafeUntil moved an earlier deadline")
	}
}
