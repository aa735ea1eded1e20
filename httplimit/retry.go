package httplimit

import "strconv"

// SecondsUp is ms in whole seconds, rounded up.
func SecondsUp(ms int64) int64 { return (ms + 999) / 1000 }

// CeilSeconds formats ms as whole seconds, rounded up.
func CeilSeconds(ms int64) string { return strconv.FormatInt(SecondsUp(ms), 10) }

// RetryAfterSecs is the Retry-After of a wait of ms: whole seconds rounded
// up, at least 1 (0 would invite an immediate retry that is bound to fail).
func RetryAfterSecs(ms int64) int64 { return max(1, SecondsUp(ms)) }

// RetryAfterSeconds formats RetryAfterSecs(ms).
func RetryAfterSeconds(ms int64) string { return strconv.FormatInt(RetryAfterSecs(ms), 10) }

// RetryAfter is the Retry-After header value of a wait of ms, the
// same one for every answer with a wait of up to a minute (net/http only
// reads header values; each has capacity 1, so an append copies it).
func RetryAfter(ms int64) []string {
	if s := RetryAfterSecs(ms); s < int64(len(retryAfterValues)) {
		return retryAfterValues[s]
	}
	return []string{RetryAfterSeconds(ms)}
}

var retryAfterValues = func() (v [61][]string) {
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()
