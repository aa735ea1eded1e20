// Package logs builds the binaries' hclog loggers from their flags and
// routes the libraries that log on their own (go-redis) through them, so an
// operator reads one format.
package logs

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// New returns a logger named name at level (trace, debug, info, warn or
// error), in JSON when json is set. An unknown level is an error naming
// the valid ones, not a silent default.
func New(name, level string, json bool, w io.Writer) (hclog.Logger, error) {
	l := hclog.LevelFromString(level)
	if l == hclog.NoLevel {
		return nil, fmt.Errorf("--log-level %q: use trace, debug, info, warn or error", level)
	}
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: l, Output: w, JSONFormat: json}), nil
}

// RouteRedis sends go-redis's own log lines (connection pool trouble,
// mostly) through log at warn level, instead of the standard logger's
// other format on stderr. go-redis has one process-wide logger, so the
// last call wins; the binaries call it once.
func RouteRedis(log hclog.Logger) {
	redis.SetLogger(redisLogger{log.Named("redis")})
}

type redisLogger struct{ l hclog.Logger }

func (r redisLogger) Printf(_ context.Context, format string, v ...any) {
	r.l.Warn(strings.TrimSpace(fmt.Sprintf(format, v...)))
}
