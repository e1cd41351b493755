package raft

// Kill is kill, for the package's tests.
func (n *Node) Kill() error { return n.kill() }
