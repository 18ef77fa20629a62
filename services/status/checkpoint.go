package status

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// saveCheckpoint stores a task's fold state, gzipped (the outcome bytes of a
// large task are long runs of the same value and shrink a hundredfold),
// with its progress's updated_at in the object's metadata: the progress
// value written after it in the same flush carries the same time, and
// reconcile.go compares the two without reading the checkpoint.
func (s *Service) saveCheckpoint(ctx context.Context, f *taskFold) error {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(f); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	meta := jetstream.ObjectMeta{
		Name:     f.P.TaskID,
		Metadata: map[string]string{checkpointProgressAt: f.P.UpdatedAt.Format(time.RFC3339Nano)},
	}
	_, err := s.checkpoints.Put(ctx, meta, &buf)
	return err
}

// checkpointProgressAt names the checkpoint's metadata entry holding the
// updated_at of the progress it was saved with.
const checkpointProgressAt = "progress-updated-at"

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
