package coordinator

import "context"

// readState is loadState within the etcd timeout, its outcome recorded in
// the replica's etcd health.
func (c *Coordinator) readState(ctx context.Context) (*state, error) {
	var st *state
	err := c.etcdCall(ctx, "read the coordinator state", func(ctx context.Context) (err error) {
		st, err = loadState(ctx, c.cli, c.keys)
		return err
	})
	return st, err
}
