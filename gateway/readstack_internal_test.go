package gateway

import (
	"strings"
	"testing"
)

// Test_onReaderStack: only a shallow mutate is decoded on the reader's
// long-lived stack. frames.Decode's validator recurses once per nesting
// level, so a mutate nested 9,999 deep (20 KB) grew the reader's stack to
// 512 KiB, which an idle session then kept for several GCs: memory a
// client could pin on every session it opens.
func Test_onReaderStack(t *testing.T) {
	t.Parallel()
	const head = `{"type":"mutate","v":1,"key":"k","seq":0,"name":"publish","input":{"topic":"t","data":`
	deep := strings.Repeat("[", 9999) + strings.Repeat("]", 9999)
	for _, tt := range []struct {
		name string
		line string
		want bool
	}{
		{"publish", head + `{"text":"hi","n":[1,2]}}}`, true},
		{"subscribe", `{"type":"subscribe","v":1,"op":"add","sid":"s","target":{"kind":"topic","topic":"t","cursor":null}}`, false},
		{"deep mutate", head + deep + `}}`, false},
		{"many brackets", head + "[" + strings.Repeat("[],", maxReaderBrackets) + "[]]}}", false},
	} {
		if got := onReaderStack([]byte(tt.line)); got != tt.want {
			t.Errorf("%s: onReaderStack = %v, want %v", tt.name, got, tt.want)
		}
	}
}
