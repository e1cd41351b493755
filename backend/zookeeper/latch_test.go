package zookeeper

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

func TestSortChildrenLikeCurator(t *testing.T) {
	kids := []string{
		"_c_ffffffff-ffff-4fff-bfff-ffffffffffff-latch-0000000003",
		"stray",
		"latch-0000000010",
		"_c_00000000-0000-4000-8000-000000000000-latch-0000000007",
		"latch-0000000001",
		// A sequence past 2^31 wraps to a negative number, which Curator's
		// string comparison puts first.
		"_c_12345678-1234-4234-8234-123456789abc-latch--2147483647",
	}
	sortChildren(kids)
	want := []string{
		"_c_12345678-1234-4234-8234-123456789abc-latch--2147483647",
		"latch-0000000001",
		"_c_ffffffff-ffff-4fff-bfff-ffffffffffff-latch-0000000003",
		"_c_00000000-0000-4000-8000-000000000000-latch-0000000007",
		"latch-0000000010",
		"stray", // no "latch-": sorted by its whole name, after the digits
	}
	if !slices.Equal(kids, want) {
		t.Errorf("sorted:\n%s\nwant:\n%s", strings.Join(kids, "\n"), strings.Join(want, "\n"))
	}
}

func TestProtectedPrefix(t *testing.T) {
	p := newProtectedPrefix()
	id, ok := protectedID(p + lockName + "0000000001")
	if !ok || p != protectedPrefix+id+"-" {
		t.Fatalf("protectedID(%q) = %q, %v", p+lockName, id, ok)
	}
	// Curator checks the UUID with UUID.fromString, which takes a version
	// 4 UUID such as ours; we make sure of the form.
	if id[14] != '4' || !strings.ContainsRune("89ab", rune(id[19])) {
		t.Errorf("%s is not a version 4, variant 1 UUID", id)
	}
	if newProtectedPrefix() == p {
		t.Errorf("two prefixes alike: %s", p)
	}
	for _, name := range []string{
		"latch-0000000001",
		"_c_-latch-0000000001",
		"_c_12345678-1234-4234-8234-123456789abc", // nothing after the UUID
		"_c_12345678-1234-4234-8234-123456789abcX-latch-1",
		"_c_12345678x1234-4234-8234-123456789abc-latch-1",
		"_c_1234567g-1234-4234-8234-123456789abc-latch-1",
	} {
		if id, ok := protectedID(name); ok {
			t.Errorf("protectedID(%q) = %q, want none", name, id)
		}
	}
	kids := []string{"latch-0000000001", p + "latch-0000000002", newProtectedPrefix() + "latch-0000000003"}
	if got := findProtected(kids, p); got != kids[1] {
		t.Errorf("findProtected = %q, want %q", got, kids[1])
	}
	if got := findProtected(kids, newProtectedPrefix()); got != "" {
		t.Errorf("findProtected of an unknown prefix = %q", got)
	}
}

// javaOrder is the reference for javaCompare: Java compares strings by
// UTF-16 code unit.
func javaOrder(a, b string) int {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	return slices.Compare(ua, ub)
}

func TestJavaCompare(t *testing.T) {
	for _, c := range [][2]string{
		{"", ""}, {"a", ""}, {"a", "b"}, {"0000000009", "0000000010"},
		{"\uffff", "\U00010000"}, // Go's byte order and Java's disagree here
		{"\ue000", "\U0001f600"}, {"\U0001f600", "\U0001f601"}, {"x\xff", "x\ufffd"},
	} {
		for _, p := range [][2]string{c, {c[1], c[0]}} {
			if got, want := javaCompare(p[0], p[1]), javaOrder(p[0], p[1]); got != want {
				t.Errorf("javaCompare(%q, %q) = %d, want %d", p[0], p[1], got, want)
			}
		}
	}
}

// FuzzLatchNames checks the parsers of node names on arbitrary input: they
// never panic, sortKey is what follows the last "latch-", javaCompare
// agrees with Java's order, protectedID accepts only what it returns a
// well-formed UUID for, and latch nodes sort by their sequence numbers.
func FuzzLatchNames(f *testing.F) {
	f.Add("_c_12345678-1234-4234-8234-123456789abc-latch-0000000042", "latch-0000000007", uint32(42), uint32(7))
	f.Add("stray", "\U0001f600latch-", uint32(0), uint32(1<<31-1))
	f.Add("latch-latch-0000000001", "_c_-latch-", uint32(10), uint32(9))
	f.Fuzz(func(t *testing.T, a, b string, m, n uint32) {
		for _, s := range []string{a, b} {
			k := sortKey(s)
			if !strings.HasSuffix(s, k) {
				t.Fatalf("sortKey(%q) = %q, not a suffix", s, k)
			}
			if i := strings.LastIndex(s, lockName); i >= 0 && k != s[i+len(lockName):] {
				t.Fatalf("sortKey(%q) = %q, want what follows the last %q", s, k, lockName)
			}
			if id, ok := protectedID(s); ok {
				if !strings.HasPrefix(s, protectedPrefix+id+"-") || len(id) != uuidLen {
					t.Fatalf("protectedID(%q) = %q", s, id)
				}
			}
		}
		if got, want := javaCompare(a, b), javaOrder(a, b); got != want {
			t.Fatalf("javaCompare(%q, %q) = %d, Java says %d", a, b, got, want)
		}
		// Two latch nodes, whatever their prefixes, sort by sequence.
		m, n = m&(1<<31-1), n&(1<<31-1)
		x := strings.ReplaceAll(a, "/", "") + lockName + fmt.Sprintf("%010d", m)
		y := strings.ReplaceAll(b, "/", "") + lockName + fmt.Sprintf("%010d", n)
		kids := []string{y, x}
		sortChildren(kids)
		if m < n && kids[0] != x || n < m && kids[0] != y {
			t.Fatalf("sequence %d and %d sorted as %q", m, n, kids)
		}
	})
}
