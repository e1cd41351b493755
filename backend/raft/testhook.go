package raft

import "github.com/batonhq/baton/internal/testhook"

func init() {
	testhook.KillRaftNode = func(node any) error { return node.(*Node).kill() }
}
