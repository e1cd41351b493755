package postgres

import "time"

// WithListenTiming returns o with the LISTEN connection's health timing
// replaced (zero keeps a default): tests cannot wait the defaults out.
func WithListenTiming(o Options, ping, pingTimeout, retry time.Duration) Options {
	o.listenTiming = listenTiming{ping: ping, pingTimeout: pingTimeout, retry: retry, retryMax: retry}
	return o
}
