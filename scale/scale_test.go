package scale

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// Down and Up agree with exact arithmetic wherever the result fits,
// products far beyond an int64 included.
func TestDownUpExact(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100_000 {
		x, num := r.Int64N(math.MaxInt64), r.Int64N(math.MaxInt64)
		den := max(num, 1+r.Int64N(math.MaxInt64)) // num ≤ den: the result fits
		p := new(big.Int).Mul(big.NewInt(x), big.NewInt(num))
		q, m := new(big.Int).QuoRem(p, big.NewInt(den), new(big.Int))
		if got := Down(x, num, den); got != q.Int64() {
			t.Fatalf("Down(%d, %d, %d) = %d, want %s", x, num, den, got, q)
		}
		want := q.Int64()
		if m.Sign() != 0 {
			want++
		}
		if got := Up(x, num, den); got != want {
			t.Fatalf("Up(%d, %d, %d) = %d, want %d", x, num, den, got, want)
		}
	}
}
