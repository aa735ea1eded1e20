package coordinator

import (
	"fmt"
	"testing"
	"time"
)

// A claim holds a name for its process until hold after its last call;
// another nonce is refused meanwhile with the time left, and takes the
// name after. Expired claims are pruned as the map grows.
func TestInstanceClaims(t *testing.T) {
	c := newInstanceClaims(10 * time.Second)
	if ok, _ := c.take("us", "us-a", "n1", "", 0); !ok {
		t.Fatal("a free name was refused")
	}
	if ok, left := c.take("us", "us-a", "n2", "", 4*time.Second); ok || left != 6*time.Second {
		t.Fatalf("a new nonce for a held name: ok=%v left=%v, want refused for 6s", ok, left)
	}
	if ok, _ := c.take("eu", "us-a", "n2", "", 4*time.Second); !ok {
		t.Fatal("the same name in another region was refused")
	}
	if ok, _ := c.take("us", "us-a", "n1", "", 9*time.Second); !ok {
		t.Fatal("the holder's renewal was refused")
	}
	if ok, left := c.take("us", "us-a", "n2", "", 18*time.Second); ok || left != time.Second {
		t.Fatalf("renewal did not extend the claim: ok=%v left=%v", ok, left)
	}
	if ok, _ := c.take("us", "us-a", "n2", "", 19*time.Second); !ok {
		t.Fatal("the name stayed held after its process's grants ended")
	}
	if ok, _ := c.take("us", "us-a", "n1", "", 20*time.Second); ok {
		t.Fatal("the old process took its name back from the new one")
	}
	// A successor that names the holder takes the name at once; one that
	// names another process does not.
	if ok, _ := c.take("us", "us-a", "n3", "n1", 21*time.Second); ok {
		t.Fatal("a process naming a predecessor that does not hold the name took it")
	}
	if ok, _ := c.take("us", "us-a", "n3", "n2", 21*time.Second); !ok {
		t.Fatal("the successor of the holder was refused")
	}
	if ok, _ := c.take("us", "us-a", "n2", "", 22*time.Second); ok {
		t.Fatal("the replaced process took its name back from its successor")
	}
	for i := range 1000 {
		c.take("us", fmt.Sprint("flood-", i), "n", "", time.Duration(i)*time.Second)
	}
	if n := len(c.by); n > 2*minSweep+20 {
		t.Fatalf("%d claims kept, most of them expired", n)
	}
}
