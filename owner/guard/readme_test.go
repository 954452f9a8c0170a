package guard_test

import (
	"os"
	"strings"
	"testing"
)

// TestTheREADMESampleIsThisExample: the Go blocks of the README's "Guards for app backends" are
// the lines of Example and saveEvent (example_test.go), in order, so that the sample a newcomer
// copies is code that compiles.
func TestTheREADMESampleIsThisExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Guards for app backends\n")
	if !ok {
		t.Fatal("the README has no section \"Guards for app backends\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var sample []string
	for rest := section; ; {
		_, block, found := strings.Cut(rest, "```go\n")
		if !found {
			break
		}
		block, rest, _ = strings.Cut(block, "```")
		for line := range strings.SplitSeq(block, "\n") {
			if line = strings.TrimSpace(line); line != "" {
				sample = append(sample, line)
			}
		}
	}
	if len(sample) < 10 {
		t.Fatalf("the section's Go blocks have %d lines", len(sample))
	}
	var code []string
	for line := range strings.SplitSeq(string(example), "\n") {
		code = append(code, strings.TrimSpace(line))
	}
	i := 0
	for _, want := range sample {
		for i < len(code) && code[i] != want {
			i++
		}
		if i == len(code) {
			t.Fatalf("the README's line %q is not in example_test.go (in the README's order)", want)
		}
		i++
	}
}
