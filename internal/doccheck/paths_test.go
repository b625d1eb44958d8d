// Package doccheck holds tests of the repository's own documents: the paths
// README.md, docs/*.md, e2e/*/README.md and the CI files cite are checked
// against the tree, so that a package move cannot leave a reader looking in
// a room that no longer exists.
package doccheck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository root, relative to this package.
const root = "../.."

// A citation is one path a document names, where it names it.
type citation struct {
	file string // document, relative to the root
	line int
	path string // as cited
	rel  string // relative to the root, as the test resolves it
}

func (c citation) String() string {
	return fmt.Sprintf("%s:%d: %s", c.file, c.line, c.path)
}

var (
	// A Markdown link target: [text](target) or [text](target#anchor).
	linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// The module's import path followed by a package path.
	importRE = regexp.MustCompile(`github\.com/softroce/softroce/([A-Za-z0-9_.\-/]+)`)
)

// pathRE matches a word that starts with one of the repository's top-level
// directories (tops) and goes on with at least one more path element:
// `serve/mem.go`, ./e2e/netns, .ci/run, e2e/*/README.md. A word preceded by
// a letter, a digit, '/', '.', '-', '$' or '~' is part of something else (a
// URL, a home or cache directory, an import path, another project's path)
// and is not matched.
func pathRE(tops []string) *regexp.Regexp {
	q := make([]string, len(tops))
	for i, t := range tops {
		q[i] = regexp.QuoteMeta(t)
	}
	return regexp.MustCompile(`(?:^|[^A-Za-z0-9_/.\-$~])((?:\./)?(?:` + strings.Join(q, "|") + `)(?:/[A-Za-z0-9_.\-*?{},<>]+)+/?)`)
}

// topDirs lists the repository's top-level directories, .git excepted.
func topDirs(t *testing.T) []string {
	es, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var tops []string
	for _, e := range es {
		if e.IsDir() && e.Name() != ".git" {
			tops = append(tops, e.Name())
		}
	}
	// Longest first, so that no name matches as a prefix of a longer one.
	slices.SortFunc(tops, func(a, b string) int { return len(b) - len(a) })
	return tops
}

// citations returns the repository paths a document cites: link targets
// (relative to the document's directory), import paths of the module, and
// words that begin with a top-level directory (relative to the root).
func citations(file, text string, words *regexp.Regexp) []citation {
	var cs []citation
	dir := path.Dir(file)
	for i, line := range strings.Split(text, "\n") {
		n := i + 1
		for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			cs = append(cs, citation{file, n, m[1], path.Join(dir, target)})
		}
		for _, m := range importRE.FindAllStringSubmatch(line, -1) {
			p := strings.TrimRight(m[1], ".,:;")
			cs = append(cs, citation{file, n, m[0], p})
		}
		for _, m := range words.FindAllStringSubmatch(line, -1) {
			p := strings.TrimRight(m[1], ".,:;")
			if strings.HasSuffix(p, "/...") {
				p = strings.TrimSuffix(p, "/...")
			}
			cs = append(cs, citation{file, n, p, path.Clean(p)})
		}
	}
	return cs
}

// built are the paths documents cite that a build writes and the
// repository ignores, each with the directory that must hold what builds it.
var built = map[string]string{
	"abi/build": "abi/Makefile", // make -C abi
}

// identRE matches a package path followed by one of its identifiers, as
// docs write them: bth/mad.Parse, nic/udp.Config.
var identRE = regexp.MustCompile(`^(.+?)(\.[A-Z][A-Za-z0-9_]*)+$`)

// exists reports whether a cited path names something in the tree. A path
// with a glob (*, ?) must match at least one file; one with a placeholder
// or an alternation ({a,b}, <x>) is checked up to the element before it; a
// package path followed by an identifier is checked for the package.
func exists(rel string) bool {
	if src, ok := built[rel]; ok {
		rel = src
	}
	if m := identRE.FindStringSubmatch(rel); m != nil {
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(m[1]))); err == nil && fi.IsDir() {
			return true
		}
	}
	if i := strings.IndexAny(rel, "{}<>,"); i >= 0 {
		rel = path.Dir(rel[:i+1])
	}
	if strings.ContainsAny(rel, "*?") {
		m, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(rel)))
		return err == nil && len(m) > 0
	}
	_, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
	return err == nil
}

// documents lists the files whose citations are checked, relative to the
// root.
func documents(t *testing.T) []string {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	e2e, err := filepath.Glob(filepath.Join(root, "e2e", "*", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md", ".ci/run", ".ci/expected-skips"}
	for _, d := range append(docs, e2e...) {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

// TestCitedPathsExist: every repository path README.md, docs/*.md,
// e2e/*/README.md, .ci/run and .ci/expected-skips cite exists, and every package .ci/expected-skips
// names by a plain path (not a pattern) is a directory of the tree.
func TestCitedPathsExist(t *testing.T) {
	words := pathRE(topDirs(t))
	checked := 0
	for _, f := range documents(t) {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range citations(f, string(b), words) {
			checked++
			if !exists(c.rel) {
				t.Errorf("%s does not exist (%s, from the repository root)", c, c.rel)
			}
		}
	}
	for _, c := range skipPackages(t) {
		checked++
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(c.rel))); err != nil || !fi.IsDir() {
			t.Errorf("%s: package %s is not a directory of the tree", c, c.rel)
		}
	}
	// A regression in the patterns that finds nothing would pass silently.
	if checked < 200 {
		t.Errorf("only %d citations checked: the patterns have stopped finding them", checked)
	}
	t.Logf("%d citations checked", checked)
}

// skipPackages returns the plain package paths in the PACKAGE column of
// .ci/expected-skips: each alternative of the regular expression made only
// of path characters.
func skipPackages(t *testing.T) []citation {
	const f = ".ci/expected-skips"
	b, err := os.ReadFile(filepath.Join(root, f))
	if err != nil {
		t.Fatal(err)
	}
	plain := regexp.MustCompile(`^[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+)*$`)
	var cs []citation
	for i, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		for _, alt := range strings.Split(fields[0], "|") {
			if plain.MatchString(alt) {
				cs = append(cs, citation{f, i + 1, alt, alt})
			}
		}
	}
	if len(cs) == 0 {
		t.Fatalf("%s names no package by its path", f)
	}
	return cs
}

// TestCitationPatterns: the patterns find the citations a document makes
// and leave prose, URLs, home directories and other projects' paths alone.
func TestCitationPatterns(t *testing.T) {
	words := pathRE([]string{"serve", "e2e", "nic", ".ci", "docs", "conformance"})
	text := "see `serve/mem.go`, and run `go test ./e2e/netns` (.ci/run reads .ci/expected-skips).\n" +
		"every e2e/*/README.md; [the ABI](abi.md#figures) and [design](../serve/proto.go).\n" +
		"client/server, github.com/softroce/softroce/nic/udp, https://example.org/serve/x, ~/.cache/softroce/rxevm,\n" +
		"$HOME/serve/x, libibverbs/examples/{rc,uc}_pingpong.c, nic/udp; e2e/... in docs/\n" +
		"the conformance/ tree, and conformance/{cases,replay}.\n"
	var got []string
	for _, c := range citations("docs/x.md", text, words) {
		got = append(got, fmt.Sprintf("%d %s", c.line, c.rel))
	}
	want := []string{
		"1 serve/mem.go", "1 e2e/netns", "1 .ci/run", "1 .ci/expected-skips",
		"2 docs/abi.md", "2 serve/proto.go", "2 e2e/*/README.md",
		"3 nic/udp",
		"4 nic/udp", "4 e2e",
		"5 conformance/{cases,replay}",
	}
	if !slices.Equal(got, want) {
		t.Errorf("citations:\n got %q\nwant %q", got, want)
	}
	for rel, want := range map[string]bool{
		"serve":                        true,
		"serve/proto.go":               true,
		"serve/no-such-file.go":        false,
		"e2e/*/README.md":              true,
		"e2e/*/NO-SUCH.md":             false,
		"conformance/{cases,replay}":   true,
		"no-such-dir/{a,b}":            false,
		"conformance/interop/setup.go": false,
		"nic/udp.Config.GSO":           true,
		"nic/nosuch.Config":            false,
		"abi/build":                    true,
	} {
		if got := exists(rel); got != want {
			t.Errorf("exists(%q) = %v, want %v", rel, got, want)
		}
	}
}
