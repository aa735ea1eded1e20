// Package logs builds the binaries' hclog loggers from their flags and
// routes the libraries that log on their own (go-redis, gRPC) through
// them, so an operator reads one format.
package logs

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/grpclog"
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

// RouteGRPC sends gRPC's own log lines through log: its info at debug
// level (it is chatty about connection states), and so its channel-level
// ("[core]") warnings, which repeat at every reconnection attempt while a
// peer is down (a coordinator outage is logged by the agent itself, once,
// paced, and "recovered"); other warnings and errors as such. gRPC has
// one process-wide logger that it reads without a lock: call this once,
// in main, before any gRPC connection or server exists.
func RouteGRPC(log hclog.Logger) {
	grpclog.SetLoggerV2(grpcLogger{log.Named("grpc")})
}

type grpcLogger struct{ l hclog.Logger }

func (g grpcLogger) Info(args ...any)                    { g.l.Debug(fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any)                  { g.l.Debug(strings.TrimSpace(fmt.Sprintln(args...))) }
func (g grpcLogger) Infof(format string, args ...any)    { g.l.Debug(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Warning(args ...any)                 { g.warn(fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)               { g.warn(strings.TrimSpace(fmt.Sprintln(args...))) }
func (g grpcLogger) Warningf(format string, args ...any) { g.warn(fmt.Sprintf(format, args...)) }

func (g grpcLogger) warn(msg string) {
	if strings.HasPrefix(msg, "[core]") {
		g.l.Debug(msg)
		return
	}
	g.l.Warn(msg)
}
func (g grpcLogger) Error(args ...any)                 { g.l.Error(fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)               { g.l.Error(strings.TrimSpace(fmt.Sprintln(args...))) }
func (g grpcLogger) Errorf(format string, args ...any) { g.l.Error(fmt.Sprintf(format, args...)) }
func (g grpcLogger) Fatal(args ...any)                 { g.l.Error(fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any) {
	g.l.Error(strings.TrimSpace(fmt.Sprintln(args...)))
	os.Exit(1)
}
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.l.Error(fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether verbosity level l is logged: only with debug on.
func (g grpcLogger) V(l int) bool { return l <= 0 || g.l.IsDebug() }
