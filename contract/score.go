package contract

import (
	"math"
	"time"
)

// BucketScores is KV broadcast_scores: each account's health score over
// the last hour, keyed by account name, written by the status process that
// folds events.
const BucketScores = "broadcast_scores"

// AccountScore is the value of KV broadcast_scores: the account's outcomes
// in the window and the score they give.
type AccountScore struct {
	// Score is 0 (failing) to 100 (healthy); see HealthScore.
	Score  int      `json:"score"`
	Window Duration `json:"window"`
	// Sent, Delivered and Undelivered count recipients; Blocked the
	// receipts that say a recipient blocked or reported the sender or opted
	// out (WhatsApp 131050 and 131026, an email complaint); RateLimited the
	// attempts the provider refused as too fast, of Attempts in all.
	Sent        int       `json:"sent"`
	Delivered   int       `json:"delivered"`
	Undelivered int       `json:"undelivered"`
	Blocked     int       `json:"blocked"`
	RateLimited int       `json:"rate_limited"`
	Attempts    int       `json:"attempts"`
	Quality     string    `json:"quality,omitempty"`
	At          time.Time `json:"at"`
}

// minReceiptsForRate is how many receipts the delivery rate needs before
// it counts: fewer say too little.
const minReceiptsForRate = 10

// HealthScore computes an account's score from its window's counts and its
// quality rating: 100 × delivery rate × (1 − 10 × block share) × (1 − 2 ×
// rate-limited share) × quality factor (GREEN or unknown 1, YELLOW 0.7, RED
// 0.3), each factor kept within 0..1. The delivery rate is delivered over
// delivered plus undelivered, taken as 1 below ten receipts; the block
// share is blocked over sent, so one recipient in ten blocking gives 0.
func HealthScore(s AccountScore) int {
	delivery := 1.0
	if n := s.Delivered + s.Undelivered; n >= minReceiptsForRate {
		delivery = float64(s.Delivered) / float64(n)
	}
	blocks := 1.0
	if s.Sent > 0 {
		blocks = clamp01(1 - 10*float64(s.Blocked)/float64(s.Sent))
	}
	limited := 1.0
	if s.Attempts > 0 {
		limited = clamp01(1 - 2*float64(s.RateLimited)/float64(s.Attempts))
	}
	quality := 1.0
	switch s.Quality {
	case QualityYellow:
		quality = 0.7
	case QualityRed:
		quality = 0.3
	}
	return int(math.Round(100 * clamp01(delivery) * blocks * limited * quality))
}

func clamp01(v float64) float64 { return max(0, min(1, v)) }
