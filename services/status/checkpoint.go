package status

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/nats-io/nats.go/jetstream"
)

// saveCheckpoint stores a task's fold state, gzipped (the outcome bytes of a
// large task are long runs of the same value and shrink a hundredfold).
func (s *Service) saveCheckpoint(ctx context.Context, f *taskFold) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(f); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	_, err := s.checkpoints.PutBytes(ctx, f.P.TaskID, buf.Bytes())
	return err
}

// loadCheckpoint returns the saved fold state of a task, or nil if none.
func (s *Service) loadCheckpoint(ctx context.Context, taskID string) (*taskFold, error) {
	data, err := s.checkpoints.GetBytes(ctx, taskID)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", taskID, err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", taskID, err)
	}
	f := newFold(taskID)
	if err := json.Unmarshal(raw, f); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", taskID, err)
	}
	if f.Tests == nil {
		f.Tests = map[int]outcome{}
	}
	return f, nil
}
