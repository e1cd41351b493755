package discovery

import (
	"errors"
	"testing"
)

func TestDNSInvalid(t *testing.T) {
	for _, tt := range []struct {
		name string
		port int
	}{
		{"", 7000},
		{"peers.example.test", 0},
		{"peers.example.test", 65536},
		{"bad name.test", 7000},
		{"10.0.0.256", 7000},
	} {
		if d, err := DNS(tt.name, tt.port, DNSOptions{}); err == nil || !errors.Is(err, ErrInvalidAddress) {
			t.Errorf("DNS(%q, %d) = %v, %v; want an error wrapping ErrInvalidAddress", tt.name, tt.port, d, err)
		}
	}
}
