package frames

import (
	"errors"
	"strconv"
)

// Offsets address messages in a topic or stream, in the Durable Streams
// form "%016d_%016d": two parts of 16 decimal digits joined by '_'. Every
// offset has the same length, so comparing offsets as strings (byte-wise)
// orders them as the number pairs (hi, lo) are ordered.
//
// ZeroOffset is the position before the first message of any stream.
const (
	ZeroOffset = "0000000000000000_0000000000000000"

	// MaxOffsetPart is the largest value either part of an offset can
	// hold: 16 decimal digits.
	MaxOffsetPart = 9999999999999999

	offsetDigits = 16
	offsetLen    = 2*offsetDigits + 1
)

// ErrBadOffset is returned (wrapped) by [ParseOffset] for a string that is
// not an offset.
var ErrBadOffset = errors.New("frames: bad offset")

// FormatOffset returns the offset of the pair (hi, lo).
//
// It panics if hi or lo is above [MaxOffsetPart]: the part would need a
// 17th digit and break the string ordering, and clamping would hand out
// the same offset twice. Callers that count toward the limit must roll
// over to the next hi (or refuse to append) before they reach it.
func FormatOffset(hi, lo uint64) string {
	if hi > MaxOffsetPart || lo > MaxOffsetPart {
		panic("frames: FormatOffset: part above MaxOffsetPart: hi=" +
			strconv.FormatUint(hi, 10) + " lo=" + strconv.FormatUint(lo, 10))
	}
	var b [offsetLen]byte
	putDigits(b[:offsetDigits], hi)
	b[offsetDigits] = '_'
	putDigits(b[offsetDigits+1:], lo)
	return string(b[:])
}

// putDigits writes v into b as len(b) decimal digits, zero-padded.
func putDigits(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
}

// ParseOffset returns the parts of the offset s. It is strict: s must be
// exactly 33 bytes, 16 ASCII digits, '_', 16 ASCII digits. Any other
// string, including "", yields an error wrapping [ErrBadOffset].
func ParseOffset(s string) (hi, lo uint64, err error) {
	if !validOffset(s) {
		return 0, 0, badOffset(s)
	}
	return digitsValue(s[:offsetDigits]), digitsValue(s[offsetDigits+1:]), nil
}

func badOffset(s string) error {
	if len(s) > 48 {
		s = s[:48] + "..."
	}
	return &offsetError{s: s}
}

type offsetError struct{ s string }

func (e *offsetError) Error() string {
	return "frames: bad offset " + strconv.Quote(e.s) + ": want 16 digits, '_', 16 digits"
}

func (e *offsetError) Unwrap() error { return ErrBadOffset }

// validOffset reports whether b has the offset form.
func validOffset[T string | []byte](b T) bool {
	if len(b) != offsetLen || b[offsetDigits] != '_' {
		return false
	}
	for i := 0; i < len(b); i++ {
		if i != offsetDigits && !isDigit(b[i]) {
			return false
		}
	}
	return true
}

func digitsValue(s string) uint64 {
	var v uint64
	for i := 0; i < len(s); i++ {
		v = v*10 + uint64(s[i]-'0')
	}
	return v
}
