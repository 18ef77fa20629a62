package feedback

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/broadcastd/broadcast/internal/metrics"
)

// bounceBody is the body of POST /webhooks/bounce (DESIGN.md section 4).
type bounceBody struct {
	Email  string `json:"email"`
	Type   string `json:"type"`
	Reason string `json:"reason"`
}

// maxEmailBytes is the longest address SMTP allows.
const maxEmailBytes = 320

// parseBounce validates a bounce body; errors name the field.
func parseBounce(body []byte, received time.Time) (Receipt, error) {
	var b bounceBody
	if err := json.Unmarshal(body, &b); err != nil {
		return Receipt{}, jsonError("body", err)
	}
	email := normalizeEmail(b.Email)
	if email == "" || len(email) > maxEmailBytes || !strings.Contains(email, "@") {
		return Receipt{}, fmt.Errorf("email: required, an address of at most %d bytes", maxEmailBytes)
	}
	switch b.Type {
	case BounceHard, BounceSoft, BounceComplaint:
	default:
		return Receipt{}, fmt.Errorf("type: want hard, soft or complaint, got %q", clip(b.Type, 32))
	}
	return Receipt{Source: SourceBounce, Email: email, Status: b.Type, Code: b.Type,
		Error: clip(strings.TrimSpace(b.Reason), maxErrorBytes), At: received, Received: received}, nil
}

// bouncePost accepts an email bounce or complaint, authenticated by the
// bearer token FEEDBACK_TOKEN (compared in constant time; without a token
// configured every request is refused).
func (s *Service) bouncePost(w http.ResponseWriter, r *http.Request) {
	if !s.bearerOK(r.Header.Get("Authorization")) {
		s.refuse(w, routeBounce, metrics.RefusedUnauthorized, http.StatusUnauthorized, "Authorization: want Bearer <FEEDBACK_TOKEN>")
		return
	}
	body, ok := s.readBody(w, r, routeBounce)
	if !ok {
		return
	}
	rc, err := parseBounce(body, time.Now().UTC())
	if err != nil {
		s.refuse(w, routeBounce, metrics.RefusedBadRequest, http.StatusBadRequest, err.Error())
		return
	}
	s.store(w, r, routeBounce, []Receipt{rc})
}

// bearerOK compares the presented token with FEEDBACK_TOKEN through their
// hashes, so neither the content nor the length leaks through timing.
func (s *Service) bearerOK(header string) bool {
	token, ok := strings.CutPrefix(header, "Bearer ")
	if !ok || s.cfg.Token == "" {
		return false
	}
	got, want := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(s.cfg.Token))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}
