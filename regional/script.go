package regional

import (
	"embed"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/policy"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// decideScript decides one or more requests of any algorithms in one atomic
// run (decide.lua says how a call is laid out): the clock, the shared
// helpers, one function per algorithm, then the loop over the call's
// decisions. It is immutable and loaded into Redis on first use (EVALSHA,
// falling back to EVAL on NOSCRIPT).
var decideScript = script("now.lua", "prelude.lua",
	"token_bucket.lua", "fixed_window.lua", "sliding_window.lua", "sliding_log.lua",
	"returns.lua", "reservation.lua", "decide.lua")

// algorithmCodes name each algorithm in decideScript's arguments, boxed
// once rather than at every decision.
var algorithmCodes = map[policy.Algorithm]any{
	policy.TokenBucket:   "tb",
	policy.FixedWindow:   "fw",
	policy.SlidingWindow: "sw",
	policy.SlidingLog:    "sl",
}

// bornScript reads a birth marker and records a lost one (Engine.StoreBorn).
var bornScript = script("now.lua", "born.lua")

// script joins the embedded files into one script.
func script(files ...string) *redis.Script {
	var src []byte
	for _, f := range files {
		b, err := luaFiles.ReadFile("lua/" + f)
		if err != nil {
			panic(err) // embedded at build time: cannot happen
		}
		src = append(append(src, b...), '\n')
	}
	return redis.NewScript(string(src))
}
