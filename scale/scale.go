// Package scale computes x·num/den on int64 without overflow: the
// fixed-point arithmetic every share, limit and split of quota-lease
// needs, where x·num alone may exceed an int64 (a limit in micro-units
// times a window in milliseconds). It is pure and links only math/bits.
package scale

import "math/bits"

// Down returns x·num/den rounded down. It is exact for x, num ≥ 0 and
// den > 0 whose result fits in an int64 (for instance num ≤ den).
func Down(x, num, den int64) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(num))
	q, _ := bits.Div64(hi, lo, uint64(den))
	return int64(q)
}

// Up returns x·num/den rounded up, under Down's conditions.
func Up(x, num, den int64) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(num))
	q, r := bits.Div64(hi, lo, uint64(den))
	if r != 0 {
		q++
	}
	return int64(q)
}
