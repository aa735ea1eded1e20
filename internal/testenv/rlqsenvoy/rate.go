package rlqsenvoy

// AssignedRate is the refill, in requests per second, of the token bucket
// the server assigned (Envoy's rate: tokens_per_fill over the whole seconds
// of fill_interval); 0 when the bucket holds no token-bucket assignment
// (none yet, a blanket rule, or an expired one's fallback).
func (s BucketState) AssignedRate() float64 {
	tb := s.Strategy.GetTokenBucket()
	if !s.Assigned || tb == nil {
		return 0
	}
	secs := tb.GetFillInterval().GetSeconds()
	if secs < 1 {
		return 0
	}
	return float64(tb.GetTokensPerFill().GetValue()) / float64(secs)
}
