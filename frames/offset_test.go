package frames

import (
	"errors"
	"sort"
	"testing"
)

func TestFormatOffset(t *testing.T) {
	t.Parallel()
	tests := []struct {
		hi, lo uint64
		want   string
	}{
		{0, 0, ZeroOffset},
		{0, 42, "0000000000000000_0000000000000042"},
		{3, 17, "0000000000000003_0000000000000017"},
		{MaxOffsetPart, MaxOffsetPart, "9999999999999999_9999999999999999"},
		{1234567890123456, 1, "1234567890123456_0000000000000001"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			got := FormatOffset(tt.hi, tt.lo)
			assertEqual(t, "FormatOffset", got, tt.want)
			hi, lo, err := ParseOffset(got)
			if err != nil || hi != tt.hi || lo != tt.lo {
				t.Fatalf("ParseOffset(%s) = %d, %d, %v", got, hi, lo, err)
			}
		})
	}
}

func TestFormatOffset_PanicsAboveMax(t *testing.T) {
	t.Parallel()
	for _, p := range [][2]uint64{{MaxOffsetPart + 1, 0}, {0, MaxOffsetPart + 1}, {1<<64 - 1, 1<<64 - 1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("FormatOffset(%d, %d) did not panic", p[0], p[1])
				}
			}()
			FormatOffset(p[0], p[1])
		}()
	}
}

// TestOffset_Order checks that string order is numeric order.
func TestOffset_Order(t *testing.T) {
	t.Parallel()
	pairs := [][2]uint64{{0, 0}, {0, 1}, {0, 9}, {0, 10}, {0, 99}, {0, 100}, {0, MaxOffsetPart},
		{1, 0}, {1, 2}, {2, 1}, {10, 0}, {MaxOffsetPart, 0}, {MaxOffsetPart, MaxOffsetPart}}
	offs := make([]string, len(pairs))
	for i, p := range pairs {
		offs[i] = FormatOffset(p[0], p[1])
	}
	if !sort.StringsAreSorted(offs) {
		t.Fatalf("offsets of increasing pairs are not sorted: %v", offs)
	}
	for i := 1; i < len(offs); i++ {
		if offs[i-1] >= offs[i] {
			t.Fatalf("%s >= %s", offs[i-1], offs[i])
		}
	}
}

func TestParseOffset_Rejects(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		"",
		"0",
		"0000000000000000_000000000000000",   // 32 bytes
		"0000000000000000_00000000000000000", // 34 bytes
		"0000000000000000-0000000000000000",
		"000000000000000_00000000000000000",
		"+000000000000000_0000000000000000",
		"000000000000000a_0000000000000000",
		"0000000000000000_000000000000000 ",
		" 0000000000000000_0000000000000000",
		"0000000000000000_0000000000000000\n",
		"０000000000000000_000000000000000",
	} {
		t.Run(s, func(t *testing.T) {
			t.Parallel()
			if _, _, err := ParseOffset(s); !errors.Is(err, ErrBadOffset) {
				t.Fatalf("ParseOffset(%q) err = %v, want ErrBadOffset", s, err)
			}
		})
	}
}

func TestParseOffset_Allocs(t *testing.T) {
	off := FormatOffset(7, 8)
	if n := testing.AllocsPerRun(100, func() { _, _, _ = ParseOffset(off) }); n != 0 {
		t.Fatalf("%v allocs, want 0", n)
	}
}
