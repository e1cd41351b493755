//go:build batonchaos_staletoken

package main

func init() { brokenStaleToken = true }
