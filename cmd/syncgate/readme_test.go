package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADME_ListsEverySetting keeps the README's configuration table true
// to the settings the command accepts.
func TestREADME_ListsEverySetting(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	// And no row for a setting the command does not take (a stale or
	// misspelt one): -config aside, every row names a setting, flag and
	// environment variable alike.
	known := map[string]bool{"| `-config` | `SYNCGATE_CONFIG` |": true}
	for _, s := range settings {
		known["| `-"+s.name+"` | `"+s.env+"` |"] = true
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `-[^`]*` \\| `[^`]*` \\|").FindAllString(readme, -1) {
		if !known[m] {
			t.Errorf("README has a row %s for no setting of the command", m)
		}
	}
	for _, s := range settings {
		row := "| `-" + s.name + "` | `" + s.env + "` |"
		if !strings.Contains(readme, row) {
			t.Errorf("README lacks a row starting %s", row)
		}
		def := "`" + s.def + "`"
		if s.def == "" {
			def = "(empty)"
		}
		if !strings.Contains(readme, row+" "+def+" |") {
			t.Errorf("README row for -%s does not give the default %s", s.name, def)
		}
	}
}
