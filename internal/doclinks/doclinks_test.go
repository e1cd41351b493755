// Package doclinks_test checks that every relative link in README.md and
// docs/**/*.md resolves: the file or directory it names exists, and a
// #fragment names a heading of the page it points to, with the anchor
// GitHub gives that heading. External links (http:, https:, mailto:) are
// not fetched. It imports nothing outside the standard library.
package doclinks_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository's root, relative to this package's directory.
const repoRoot = "../.."

// pages returns the Markdown files whose links are checked, relative to the
// repository's root: README.md and every .md file under docs/.
func pages(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(repoRoot, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(repoRoot, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listing docs/: %v", err)
	}
	return files
}

// link is one link of a page: its target as written and the line its
// target begins on.
type link struct {
	target string
	line   int
}

var (
	// fence opens or closes a fenced code block.
	fence = regexp.MustCompile("^\\s{0,3}(```|~~~)")
	// codeSpan is an inline code span of one or two backticks.
	codeSpan = regexp.MustCompile("``[^`]+``|`[^`\n]+`")
	// inlineLink is [text](target) or ![alt](target), with an optional
	// title; the text may span lines.
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDef is a reference definition: [label]: target.
	refDef = regexp.MustCompile(`(?m)^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	// atxHeading is a heading line: # Title.
	atxHeading = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// htmlAnchor is an explicit anchor: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	// mdLink is a link or image inside a heading, kept as its text.
	mdLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	// scheme starts an absolute URL.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// prose returns the page's lines with fenced code blocks blanked and code
// spans replaced by spaces, so that neither yields links nor headings.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	in := ""
	for i, l := range lines {
		if m := fence.FindStringSubmatch(l); m != nil {
			if in == "" {
				in = m[1]
			} else if m[1] == in {
				in = ""
			}
			lines[i] = ""
			continue
		}
		if in != "" {
			lines[i] = ""
			continue
		}
		lines[i] = codeSpan.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat(" ", len(s)) })
	}
	return lines
}

// links returns the links of a page.
func links(text string) []link {
	body := strings.Join(prose(text), "\n")
	var out []link
	for _, re := range []*regexp.Regexp{inlineLink, refDef} {
		for _, m := range re.FindAllStringSubmatchIndex(body, -1) {
			out = append(out, link{target: body[m[2]:m[3]], line: 1 + strings.Count(body[:m[2]], "\n")})
		}
	}
	return out
}

// anchors returns the anchors of a page's headings as GitHub makes them:
// the heading's text in lower case, with everything but letters, digits,
// '_', '-' and spaces dropped and each space made a '-'; a repeated anchor
// gets -1, -2, ... appended. Explicit <a name> and id anchors count too.
func anchors(text string) map[string]bool {
	raw := strings.Split(text, "\n")
	seen := map[string]int{}
	out := map[string]bool{}
	for i, l := range prose(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(raw[i], -1) {
			out[m[1]] = true
		}
		m := atxHeading.FindStringSubmatch(raw[i])
		if m == nil || l == "" {
			continue
		}
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is the anchor of one heading's Markdown text.
func slug(heading string) string {
	heading = mdLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Hand-over before termination (`--aws`, `--aws-lifecycle-hook`)", "hand-over-before-termination---aws---aws-lifecycle-hook"},
		{"Embedded raft group (`backend/raft`, `raft://` or `agent://host:port`)", "embedded-raft-group-backendraft-raft-or-agenthostport"},
		{"The group's rule (`is-leader --backend aws-asg://`)", "the-groups-rule-is-leader---backend-aws-asg"},
		{"PostgreSQL, and beside a `pg_try_advisory_lock` loop", "postgresql-and-beside-a-pg_try_advisory_lock-loop"},
		{"Per backend: failover, hand-over, requests, 10,000 leases", "per-backend-failover-hand-over-requests-10000-leases"},
		{"See [the CLI](cli.md) *now*", "see-the-cli-now"},
	} {
		if got := slug(c.heading); got != c.want {
			t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}

func TestAnchorsAndLinks(t *testing.T) {
	page := "# Top\n\n## Same\n\n```sh\n# not a heading [x](nowhere.md)\n```\n\n## Same\n\n" +
		"See [a](other.md#x) and `[b](code.md)` and ![img](pic.png \"title\"),\n" +
		"[wrapped\ntext](#top).\n\n[ref]: ref.md\n"
	got := anchors(page)
	want := map[string]bool{"top": true, "same": true, "same-1": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("anchors = %v, want %v", got, want)
	}
	var targets []string
	for _, l := range links(page) {
		targets = append(targets, fmt.Sprintf("%s:%d", l.target, l.line))
	}
	if w := []string{"other.md#x:11", "pic.png:11", "#top:13", "ref.md:15"}; !slices.Equal(targets, w) {
		t.Errorf("links = %v, want %v", targets, w)
	}
}

// relativeTo names the directory a page's relative links start from.
func relativeTo(page string) string {
	if dir := filepath.ToSlash(filepath.Dir(page)); dir != "." {
		return dir + "/"
	}
	return "the repository's root"
}

// TestDocLinks checks every relative link of README.md and docs/**/*.md.
func TestDocLinks(t *testing.T) {
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := cache[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, path))
		if err != nil {
			return nil, err
		}
		cache[path] = anchors(string(b))
		return cache[path], nil
	}
	checked := 0
	for _, page := range pages(t) {
		b, err := os.ReadFile(filepath.Join(repoRoot, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links(string(b)) {
			if scheme.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
				continue
			}
			checked++
			path, frag, _ := strings.Cut(l.target, "#")
			target := page
			if path != "" {
				target = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
				if strings.HasPrefix(target, "../") {
					t.Errorf("%s:%d: link %q leaves the repository", page, l.line, l.target)
					continue
				}
				fi, err := os.Stat(filepath.Join(repoRoot, target))
				if err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist; fix the path (it is relative to %s)", page, l.line, l.target, target, relativeTo(page))
					continue
				}
				if fi.IsDir() {
					if frag != "" {
						t.Errorf("%s:%d: link %q: #%s on a directory", page, l.line, l.target, frag)
					}
					continue
				}
			}
			if frag == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			a, err := anchorsOf(target)
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", page, l.line, l.target, err)
				continue
			}
			if !a[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", page, l.line, l.target, target, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the page list or the link pattern is wrong")
	}
	t.Logf("%d relative links checked", checked)
}
