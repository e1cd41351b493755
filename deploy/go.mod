module github.com/batonhq/baton/deploy

go 1.26.7

require (
	github.com/batonhq/baton v0.0.0-00010101000000-000000000000
	gopkg.in/yaml.v3 v3.0.1
)

require (
	github.com/kr/pretty v0.3.1 // indirect
	gopkg.in/check.v1 v1.0.0-20201130134442-10cb98267c6c // indirect
)

replace github.com/batonhq/baton => ..
