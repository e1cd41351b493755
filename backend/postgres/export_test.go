package postgres

import "time"

// WithListenTiming returns o with the LISTEN connection's health timing
// replaced (zero keeps a default): tests cannot wait the defaults out.
func WithListenTiming(o Options, ping, pingTimeout, retry time.Duration) Options {
	o.listenTiming = listenTiming{ping: ping, pingTimeout: pingTimeout, retry: retry, retryMax: retry}
	return o
}

// WithBeforeJoin returns o with f run before each of its waiters joins a
// lease's queue, after the read that found the lease held: a test stops a
// waiter there to race a release against its join.
func WithBeforeJoin(o Options, f func(name string)) Options {
	o.beforeJoin = f
	return o
}
