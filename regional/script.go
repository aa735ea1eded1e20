package regional

import (
	"embed"

	"github.com/quota-lease/quota-lease/policy"
	"github.com/redis/go-redis/v9"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// scripts holds one decision script per algorithm: the shared prelude
// followed by the algorithm's body. They are immutable and loaded into Redis
// on first use (EVALSHA, falling back to EVAL on NOSCRIPT).
var scripts = map[policy.Algorithm]*redis.Script{
	policy.TokenBucket:   mustScript("token_bucket.lua"),
	policy.FixedWindow:   mustScript("fixed_window.lua"),
	policy.SlidingWindow: mustScript("sliding_window.lua"),
	policy.SlidingLog:    mustScript("sliding_log.lua"),
}

// bornScript reads a birth marker and records a lost one (Engine.StoreBorn).
var bornScript = func() *redis.Script {
	src, err := luaFiles.ReadFile("lua/born.lua")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	return redis.NewScript(string(src))
}()

func mustScript(body string) *redis.Script {
	prelude, err := luaFiles.ReadFile("lua/prelude.lua")
	if err != nil {
		panic(err) // embedded at build time: cannot happen
	}
	src, err := luaFiles.ReadFile("lua/" + body)
	if err != nil {
		panic(err)
	}
	return redis.NewScript(string(prelude) + "\n" + string(src))
}
