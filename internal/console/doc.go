// Package console is the coordinator's read-only web console: every
// quota with its limit, reference and published bound; per region its
// share, mode (active, shrinking, degraded, expired), demand and grant
// expiry; a chart of each quota's shares over the last hours with degraded
// periods marked; the leader and its epoch; and each quota's policy.
//
// It reads only the admin read API (Source), so what it shows is what
// `coordinator leases` and `coordinator bound` print, and it is served
// under that API's authorization (the coordinator wraps it with
// AuthorizeHTTP). Pages are rendered on the server with html/template; one
// small script of its own (static/console.js, no build step, no CDN)
// draws the charts and re-fetches the page every Config.Refresh. The
// history lives in memory on the replica that samples it (History): a
// follower's console shows policies and bounds and names the leader, whose
// console shows the shares.
package console
