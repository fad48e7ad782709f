package integration

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestReadmeLayout checks the README's layout table against the folders: a row for
// every top-level folder and a folder for every row, and every subfolder named in its
// row (testdata and _-prefixed folders left out), so that the table cannot fall behind
// a move.
func TestReadmeLayout(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([a-z0-9_-]+)/` \\| (.*) \\|$")
	rows := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		rows[m[1]] = m[2]
	}
	if len(rows) == 0 {
		t.Fatal("no rows in the README's layout table")
	}

	entries, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	var folders []string
	for _, e := range entries {
		if e.IsDir() && !ignoredFolder(e.Name()) {
			folders = append(folders, e.Name())
		}
	}
	for _, f := range folders {
		holds, ok := rows[f]
		if !ok {
			t.Errorf("README.md's layout table has no row for %s/", f)
			continue
		}
		subs, err := os.ReadDir("../" + f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range subs {
			if s.IsDir() && s.Name() != "testdata" && !strings.HasPrefix(s.Name(), "_") && !strings.Contains(holds, "`"+s.Name()) {
				t.Errorf("README.md's layout row for %s/ does not name %s", f, s.Name())
			}
		}
	}
	for r := range rows {
		if !slices.Contains(folders, r) {
			t.Errorf("README.md's layout table has a row for %s/, which does not exist", r)
		}
	}
}

// ignoredFolder reports whether a top-level folder is not part of the source tree:
// hidden ones (.git, .build, .demo) and bin (make build's output).
func ignoredFolder(name string) bool {
	return strings.HasPrefix(name, ".") || name == "bin"
}
