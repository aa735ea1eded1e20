package logs

import (
	"log"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// maxPacedKinds bounds the kinds a Paced keeps apart; lines of further
// kinds share one.
const maxPacedKinds = 64

// Paced logs each kind of line at most once per interval and counts the
// others: the next line of the kind says how many were left out
// ("suppressed"). A flood of one event (handshakes failing under a scan
// or a slowloris, a client repeating a mistake) is then a line per
// interval, not one per event, and nothing is lost but repetitions. Kinds
// must be few: reasons, never addresses. It is safe for concurrent use.
type Paced struct {
	log      hclog.Logger
	interval time.Duration
	mono     func() time.Duration // a monotonic reading (clock.Clock.Mono)

	mu    sync.Mutex
	kinds map[string]*pacedKind
}

type pacedKind struct {
	at         time.Duration // when its last line was logged
	suppressed int           // lines left out since
}

// NewPaced returns a Paced logging through log, on the monotonic clock
// mono.
func NewPaced(log hclog.Logger, interval time.Duration, mono func() time.Duration) *Paced {
	return &Paced{log: log, interval: interval, mono: mono, kinds: map[string]*pacedKind{}}
}

// Warn logs msg with args at warn level, unless a line of kind was logged
// less than the interval ago; then it only counts it.
func (p *Paced) Warn(kind, msg string, args ...any) {
	now := p.mono()
	p.mu.Lock()
	k := p.kinds[kind]
	if k == nil && len(p.kinds) >= maxPacedKinds {
		kind = "other"
		k = p.kinds[kind]
	}
	if k == nil {
		k = &pacedKind{at: now - p.interval}
		p.kinds[kind] = k
	}
	if now-k.at < p.interval {
		k.suppressed++
		p.mu.Unlock()
		return
	}
	suppressed := k.suppressed
	k.at, k.suppressed = now, 0
	p.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	p.log.Warn(msg+" (logged at most once every "+p.interval.String()+" per kind)", args...)
}

// StdLogger is a standard library logger whose lines go through p, each
// kind named by its first words (as net/http's: "http: TLS handshake
// error from ..." is of kind "http: TLS handshake"): for
// http.Server.ErrorLog, which otherwise prints every line, in a format of
// its own, on stderr.
func (p *Paced) StdLogger() *log.Logger { return log.New(pacedWriter{p}, "", 0) }

type pacedWriter struct{ p *Paced }

func (w pacedWriter) Write(b []byte) (int, error) {
	line := strings.TrimSpace(string(b))
	w.p.Warn(lineKind(line), line)
	return len(b), nil
}

// lineKind is a line's first three words: net/http's messages name their
// event there and the peer after it.
func lineKind(line string) string {
	f := strings.Fields(line)
	return strings.Join(f[:min(3, len(f))], " ")
}
