module github.com/batonhq/baton/gocronbaton

go 1.26.7

require (
	github.com/batonhq/baton v0.0.0-00010101000000-000000000000
	github.com/go-co-op/gocron/v2 v2.21.2
	github.com/google/uuid v1.6.0
)

require (
	github.com/jonboulle/clockwork v0.5.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
)

replace github.com/batonhq/baton => ..
