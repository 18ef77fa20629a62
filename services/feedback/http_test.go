package feedback

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBusyAnswers503: beyond MaxInFlight requests at once, a request is
// answered 503 at once (the provider retries) instead of holding memory.
func TestBusyAnswers503(t *testing.T) {
	t.Parallel()
	s := &Service{cfg: Config{MaxInFlight: 1, Token: "x"}}
	s.cfg.withDefaults()
	s.log = s.cfg.Logger
	h := s.handler()
	// Hold the one slot with a request whose body never ends.
	pr, pw := newBlockingBody()
	var wg sync.WaitGroup
	wg.Go(func() {
		req := httptest.NewRequest(http.MethodPost, "/webhooks/bounce", pr)
		req.Header.Set("Authorization", "Bearer x")
		h.ServeHTTP(httptest.NewRecorder(), req)
	})
	<-pr.reading
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/webhooks/whatsapp", strings.NewReader("{}")))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	pw.Close()
	wg.Wait()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/webhooks/whatsapp", strings.NewReader("{}")))
	require.Equal(t, http.StatusUnauthorized, rec.Code, "the slot is free again: unsigned")
}

// blockingBody is a request body that blocks until closed, and says when
// it is first read.
type blockingBody struct {
	reading chan struct{}
	once    sync.Once
	done    chan struct{}
}

type closer struct{ b *blockingBody }

func (c closer) Close() { close(c.b.done) }

func newBlockingBody() (*blockingBody, closer) {
	b := &blockingBody{reading: make(chan struct{}), done: make(chan struct{})}
	return b, closer{b}
}

func (b *blockingBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	<-b.done
	return 0, http.ErrBodyReadAfterClose
}
