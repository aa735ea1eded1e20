// Package tokens sizes the token bucket an Envoy instance enforces for its
// share of a policy: Shape is what the share may admit in any window, and
// Assign and Resize give the Bucket whose worst case stays within it, for
// Envoy that may start a changed bucket full (Assign) and for Envoy that
// keeps a replaced bucket's fill ratio (Resize, with the slack package edge
// keeps per instance). docs/rlqs-server.md derives the rules. The package links no
// I/O library.
package tokens
