// Package testenv holds what the tests of several packages share: an
// embedded etcd for a whole test binary, unique etcd key prefixes, waiting
// for a condition, and parsing policies that must be valid.
//
// Only _test.go files may import it; TestOnlyTestsImport enforces this.
package testenv
