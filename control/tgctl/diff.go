package tgctl

import (
	"fmt"
	"strings"
)

// diffContext is the lines of context around each hunk of a unified diff.
const diffContext = 3

// maxDiffCells bounds the longest-common-subsequence table of a diff; past it the
// texts are shown as one replaced block.
const maxDiffCells = 4 << 20

type editOp struct {
	kind byte // ' ', '-', '+'
	line string
}

// unifiedDiff returns the unified diff of a and b (as diff -u prints it), "" when
// they are equal.
func unifiedDiff(fromLabel, toLabel, a, b string) string {
	if a == b {
		return ""
	}
	ops := edits(splitLines(a), splitLines(b))
	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", fromLabel, toLabel)
	// Hunks: runs of changes with diffContext lines of context, merged when close.
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		start := max(i-diffContext, 0)
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*diffContext {
				end = min(end+diffContext, len(ops))
				break
			}
			end = run
		}
		aStart, bStart := 1, 1
		for _, op := range ops[:start] {
			if op.kind != '+' {
				aStart++
			}
			if op.kind != '-' {
				bStart++
			}
		}
		aLen, bLen := 0, 0
		for _, op := range ops[start:end] {
			if op.kind != '+' {
				aLen++
			}
			if op.kind != '-' {
				bLen++
			}
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", hunkRange(aStart, aLen), hunkRange(bStart, bLen))
		for _, op := range ops[start:end] {
			out.WriteByte(op.kind)
			out.WriteString(op.line)
			out.WriteByte('\n')
		}
		i = end
	}
	return out.String()
}

// hunkRange is a hunk's "start,length"; an empty range starts one line before.
func hunkRange(start, n int) string {
	if n == 0 {
		start--
	}
	if n == 1 {
		return fmt.Sprint(start)
	}
	return fmt.Sprintf("%d,%d", start, n)
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// edits returns an edit script from a to b over a longest common subsequence.
func edits(a, b []string) []editOp {
	// Common prefix and suffix first: most changes are small.
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		p++
	}
	s := 0
	for s < len(a)-p && s < len(b)-p && a[len(a)-1-s] == b[len(b)-1-s] {
		s++
	}
	var ops []editOp
	for _, l := range a[:p] {
		ops = append(ops, editOp{' ', l})
	}
	ma, mb := a[p:len(a)-s], b[p:len(b)-s]
	if len(ma)*len(mb) > maxDiffCells {
		for _, l := range ma {
			ops = append(ops, editOp{'-', l})
		}
		for _, l := range mb {
			ops = append(ops, editOp{'+', l})
		}
	} else {
		// lcs[i][j] is the LCS length of ma[i:] and mb[j:].
		w := len(mb) + 1
		lcs := make([]int32, (len(ma)+1)*w)
		for i := len(ma) - 1; i >= 0; i-- {
			for j := len(mb) - 1; j >= 0; j-- {
				if ma[i] == mb[j] {
					lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
				} else {
					lcs[i*w+j] = max(lcs[(i+1)*w+j], lcs[i*w+j+1])
				}
			}
		}
		i, j := 0, 0
		for i < len(ma) || j < len(mb) {
			switch {
			case i < len(ma) && j < len(mb) && ma[i] == mb[j]:
				ops = append(ops, editOp{' ', ma[i]})
				i++
				j++
			case j < len(mb) && (i == len(ma) || lcs[i*w+j+1] >= lcs[(i+1)*w+j]):
				ops = append(ops, editOp{'+', mb[j]})
				j++
			default:
				ops = append(ops, editOp{'-', ma[i]})
				i++
			}
		}
		// Deletions before insertions within a run of changes, as diff -u shows them.
		for k := p; k < len(ops); {
			if ops[k].kind == ' ' {
				k++
				continue
			}
			e := k
			for e < len(ops) && ops[e].kind != ' ' {
				e++
			}
			var del, ins []editOp
			for _, op := range ops[k:e] {
				if op.kind == '-' {
					del = append(del, op)
				} else {
					ins = append(ins, op)
				}
			}
			copy(ops[k:], append(del, ins...))
			k = e
		}
	}
	for _, l := range a[len(a)-s:] {
		ops = append(ops, editOp{' ', l})
	}
	return ops
}
