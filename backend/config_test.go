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
