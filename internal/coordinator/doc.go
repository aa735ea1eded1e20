// Package coordinator is the coordinator daemon: it keeps the global quota
// policies and the grant ledger in etcd, elects one leader among its
// replicas, and hands each region time-bounded leases on shares of every
// quota (LeaseService), while SREs manage it through AdminService. Both
// are served over one replica (Coordinator), which campaigns, leads and
// keeps the books they read and change.
//
// Safety rests on lease.Book, one per quota, held only by the leader. What
// etcd must know to keep it across a leader change is small: per quota and
// region, the most that region may be enforcing (a high-water mark). A grant
// that raises that mark is written to etcd before it is answered; renewals
// that do not raise it write nothing, and lowered marks are written in one
// batched transaction per flush interval. So etcd's write load follows
// share changes, not renewals. A new leader reads the marks and assumes each
// was granted at the moment it took over, for a full lease, before it grants
// anything (safe failover, docs/design.md).
//
// A leader grants only while its own leadership lease, measured like an
// agent's (from the send time of its last successful etcd keepalive, less
// drift and margin), is surely valid, so a deposed leader that has not yet
// noticed stops granting before a successor can be elected.
package coordinator
