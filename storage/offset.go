package storage

import (
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// maxNameLen bounds a stream name in bytes.
const maxNameLen = 1024

// offsetLen is the length of a well-formed offset string.
const offsetLen = 33

// FormatOffset returns the offset string of position n: "%016d_%016d" with
// a first part of 0. Positions count records in a stream's offset space.
func FormatOffset(n uint64) string {
	var b [offsetLen]byte
	appendOffset(b[:0], n)
	return string(b[:])
}

// appendOffset appends the offset string of n to b.
func appendOffset(b []byte, n uint64) []byte {
	b = append(b, "0000000000000000_"...)
	var d [16]byte
	for i := 15; i >= 0; i-- {
		d[i] = byte('0' + n%10)
		n /= 10
	}
	return append(b, d[:]...)
}

// ParseOffset parses an offset string. Anything that is not exactly 16
// digits, '_', 16 digits wraps [ErrBadRequest]. A nonzero first part is
// well-formed but beyond every stream's tail: it parses as math.MaxUint64.
func ParseOffset(s string) (uint64, error) {
	if len(s) != offsetLen || s[16] != '_' {
		return 0, fmt.Errorf("%w: malformed offset %q", ErrBadRequest, s)
	}
	var hi, lo uint64
	for i := 0; i < offsetLen; i++ {
		if i == 16 {
			continue
		}
		c := s[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: malformed offset %q", ErrBadRequest, s)
		}
		if i < 16 {
			hi = hi*10 + uint64(c-'0')
		} else {
			lo = lo*10 + uint64(c-'0')
		}
	}
	if hi != 0 {
		return math.MaxUint64, nil
	}
	return lo, nil
}

// NormalizeContentType returns the media type of s: parameters dropped,
// surrounding space trimmed, lowercased. Comparisons of content types use
// it; "" stays "".
func NormalizeContentType(s string) string {
	if i := strings.IndexByte(s, ';'); i >= 0 {
		s = s[:i]
	}
	return strings.ToLower(strings.TrimSpace(s))
}

// defaultContentType is a stream's type when created without one.
const defaultContentType = "application/octet-stream"

// isJSON reports whether a verbatim content type selects JSON mode.
func isJSON(ct string) bool { return NormalizeContentType(ct) == "application/json" }

// checkName validates a stream name.
func checkName(name string) error {
	if name == "" || len(name) > maxNameLen || !utf8.ValidString(name) {
		return fmt.Errorf("%w: invalid stream name", ErrBadRequest)
	}
	for _, r := range name {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: invalid stream name", ErrBadRequest)
		}
	}
	return nil
}
