module github.com/batonhq/baton/backend/zookeeper

go 1.26.7

require (
	github.com/batonhq/baton v0.0.0-00010101000000-000000000000
	github.com/go-zookeeper/zk v1.0.4
)

replace github.com/batonhq/baton => ../..
