package backendurl

import (
	"context"
	"fmt"
	"net/url"

	"github.com/batonhq/baton/backend"
	"github.com/batonhq/baton/backend/memory"
)

// parseMemoryURL accepts only memory://: the store lives in this process.
func parseMemoryURL(u *url.URL) (opener, error) {
	if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("memory URLs take nothing after the scheme: use memory:// (the store lives inside this baton process)")
	}
	return func(_ context.Context, o Options) (*Backend, error) {
		b, err := memory.New(memory.NewStore(), memory.Options{
			Config: backend.Config{TTL: o.TTL},
			Logger: o.Logger,
		})
		if err != nil {
			return nil, err
		}
		return &Backend{Backend: b, close: b.Close}, nil
	}, nil
}
