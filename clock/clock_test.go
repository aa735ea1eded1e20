package clock

import (
	"testing"
	"time"
)

func TestSystemMonoAdvances(t *testing.T) {
	c := System()
	a := c.Mono()
	time.Sleep(2 * time.Millisecond) // real time must pass: Mono is checked against it
	if b := c.Mono(); b-a < 2*time.Millisecond {
		t.Fatalf("Mono advanced %v over a 2 ms sleep", b-a)
	}
	if d := time.Since(c.Now()); d < 0 || d > time.Second {
		t.Fatalf("Now is %v away from time.Now", d)
	}
}
