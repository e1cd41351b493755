module github.com/batonhq/baton/chaos

go 1.26.7

require (
	github.com/batonhq/baton v0.0.0-00010101000000-000000000000
	github.com/spf13/cobra v1.10.2
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
)

replace github.com/batonhq/baton => ..
