package regional

import (
	"embed"

	"github.com/redis/go-redis/v9"

	"github.com/quota-lease/quota-lease/policy"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scripts holds one decision script per algorithm: the clock, the shared
// prelude, then the algorithm's body. They are immutable and loaded into Redis
// on first use (EVALSHA, falling back to EVAL on NOSCRIPT).
var scripts = map[policy.Algorithm]*redis.Script{
	policy.TokenBucket:   mustScript("token_bucket.lua"),
	policy.FixedWindow:   mustScript("fixed_window.lua"),
	policy.SlidingWindow: mustScript("sliding_window.lua"),
	policy.SlidingLog:    mustScript("sliding_log.lua"),
}

// bornScript reads a birth marker and records a lost one (Engine.StoreBorn).
var bornScript = script("now.lua", "born.lua")

// mustScript is a decision script: the clock, the shared prelude, then the
// algorithm's body.
func mustScript(body string) *redis.Script { return script("now.lua", "prelude.lua", body) }

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
