package baton

import "time"

// RenewalWindower is implemented by a Backend that can say how far ahead
// safe-until stays while renewals are healthy, at worst: its renewal
// window. ElectorConfig.StopEarly must be below it, or every term would be
// stopped as soon as it began; NewElector checks that for a Backend that
// implements it. Work that needs time to stop (a child process given a
// grace period) must fit in it.
type RenewalWindower interface {
	RenewalWindow() time.Duration
}
