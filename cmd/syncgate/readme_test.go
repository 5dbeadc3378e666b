package main

import (
	"os"
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
