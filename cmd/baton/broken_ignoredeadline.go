//go:build batonchaos_ignoredeadline

package main

func init() { brokenIgnoreDeadline = true }
