package benchkit

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Table is a text table: the first column is aligned left, the others right.
type Table struct {
	Header []string
	rows   [][]string // a nil row is a separator
}

// Row appends a row; values are formatted with %v.
func (t *Table) Row(cells ...any) {
	r := make([]string, len(cells))
	for i, c := range cells {
		r[i] = fmt.Sprint(c)
	}
	t.rows = append(t.rows, r)
}

// Separator appends a horizontal rule, unless the table has no row yet or already ends
// with one.
func (t *Table) Separator() {
	if len(t.rows) > 0 && t.rows[len(t.rows)-1] != nil {
		t.rows = append(t.rows, nil)
	}
}

// Fprint writes the table to w.
func (t *Table) Fprint(w io.Writer) error {
	n := len(t.Header)
	for _, r := range t.rows {
		n = max(n, len(r))
	}
	width := make([]int, n)
	for _, r := range append([][]string{t.Header}, t.rows...) {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	total := 0
	for _, wd := range width {
		total += wd
	}
	total += 2 * (n - 1)
	var b strings.Builder
	line := func(r []string) {
		for i := range n {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		b.WriteString("\n")
	}
	if len(t.Header) > 0 {
		line(t.Header)
		b.WriteString(strings.Repeat("-", total) + "\n")
	}
	for _, r := range t.rows {
		if r == nil {
			b.WriteString(strings.Repeat("-", total) + "\n")
			continue
		}
		line(r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
