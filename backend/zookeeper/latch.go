package zookeeper

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Curator's LeaderLatch layout. A candidate's node under the latch path is
//
//	_c_<UUID>-latch-<10-digit sequence>
//
// made by an EPHEMERAL_SEQUENTIAL create of "_c_<UUID>-latch-" with the
// participant ID as its data. "_c_<UUID>-" is Curator's protection prefix
// (CreateBuilder.withProtection): it lets a client whose create was cut off
// mid-request find out whether the node was made, by listing the children.
const (
	lockName        = "latch-"
	protectedPrefix = "_c_"
	uuidLen         = 36 // 8-4-4-4-12 hexadecimal digits and dashes
)

// newProtectedPrefix returns "_c_<random version 4 UUID>-". Curator checks
// that the id parses as a UUID before it treats a node as protected, so
// ours is one.
func newProtectedPrefix() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never fails on Linux since Go 1.24
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Sprintf("%s%x-%x-%x-%x-%x-", protectedPrefix, u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// protectedID returns the UUID of a protected node name, as Curator's
// ProtectedUtils.extractProtectedId does: the name must start with "_c_",
// carry 36 characters of UUID and then "-".
func protectedID(name string) (string, bool) {
	end := len(protectedPrefix) + uuidLen
	if len(name) <= end || !strings.HasPrefix(name, protectedPrefix) || name[end] != '-' {
		return "", false
	}
	id := name[len(protectedPrefix):end]
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return "", false
			}
		}
	}
	return id, true
}

// sortKey is what Curator sorts latch children by
// (StandardLockInternalsDriver.fixForSorting): the text after the last
// "latch-", which for our nodes and Curator's is the zero-padded sequence
// number, or the whole name when it has no "latch-" (a stray node).
func sortKey(name string) string {
	if i := strings.LastIndex(name, lockName); i >= 0 {
		return name[i+len(lockName):]
	}
	return name
}

// sortChildren orders latch children as Curator does: by sortKey, compared
// as Java compares strings (by UTF-16 code unit). Equal keys, which the
// server's sequence numbers never produce among latch nodes, are ordered by
// the whole name so that every client picks the same order.
func sortChildren(children []string) {
	slices.SortStableFunc(children, func(a, b string) int {
		if c := javaCompare(sortKey(a), sortKey(b)); c != 0 {
			return c
		}
		return javaCompare(a, b)
	})
}

// javaCompare compares a and b as java.lang.String.compareTo would compare
// them after decoding from UTF-8: by UTF-16 code units. That differs from
// Go's byte order only between characters above U+FFFF (surrogate pairs,
// D800–DFFF) and those from U+E000 to U+FFFF. Invalid bytes decode to
// U+FFFD, as Java's decoder replaces them.
func javaCompare(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if ra != rb {
			ua, ub := utf16Units(ra), utf16Units(rb)
			for i := range 2 {
				if ua[i] != ub[i] {
					if ua[i] < ub[i] {
						return -1
					}
					return 1
				}
			}
		}
		a, b = a[na:], b[nb:]
	}
	switch {
	case a == "" && b == "":
		return 0
	case a == "":
		return -1
	default:
		return 1
	}
}

// utf16Units returns r's UTF-16 code units, the second zero for a rune in
// the basic plane. Two runes differ in their first unit, or both lie above
// the basic plane.
func utf16Units(r rune) [2]uint16 {
	if r < 0x10000 {
		return [2]uint16{uint16(r)}
	}
	r -= 0x10000
	return [2]uint16{uint16(0xd800 + r>>10), uint16(0xdc00 + r&0x3ff)}
}

// findProtected returns the child whose name starts with prefix, or "".
func findProtected(children []string, prefix string) string {
	for _, c := range children {
		if strings.HasPrefix(c, prefix) {
			return c
		}
	}
	return ""
}
