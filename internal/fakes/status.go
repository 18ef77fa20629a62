package fakes

import "net/http"

// StatusRecorder passes a response through to its ResponseWriter and keeps
// the status written, for a recorder in front of a provider's handler.
// Status starts as what the handler answers when it never calls
// WriteHeader: set it to http.StatusOK.
type StatusRecorder struct {
	http.ResponseWriter
	Status int
}

// WriteHeader keeps code and writes it.
func (w *StatusRecorder) WriteHeader(code int) {
	w.Status = code
	w.ResponseWriter.WriteHeader(code)
}
