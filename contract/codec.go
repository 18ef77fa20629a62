package contract

import (
	"bytes"
	"encoding/json"
	"errors"

	gojson "github.com/goccy/go-json"
)

// Jobs and events are encoded and decoded once per recipient each (and
// recipient list lines and render batches once per recipient); with
// encoding/json that was an eighth of the benchmark's CPU (decoding a job
// took 4.4 µs, go-json 0.9 µs). go-json writes the same bytes as
// encoding/json for our types (TestCodecMatchesEncodingJSON) and decodes
// the same values (FuzzCodecMatchesEncodingJSON). Whatever go-json rejects
// or panics on is decoded again by encoding/json, so errors read as before
// and no input can crash a service through it.

var errFastDecode = errors.New("go-json panicked")

// decode decodes data into v with go-json, or with encoding/json (into a
// zeroed v) when go-json refuses it or panics.
func decode[T any](data []byte, v *T) error {
	if decodeFast(data, v) == nil {
		return nil
	}
	var zero T
	*v = zero
	return json.Unmarshal(data, v)
}

func decodeFast(data []byte, v any) (err error) {
	defer func() {
		if recover() != nil {
			err = errFastDecode
		}
	}()
	return gojson.Unmarshal(data, v)
}

// decodeTaskFast decodes a task with go-json the way decodeTaskStd does
// (unknown fields refused, nothing after the object); ok is false whenever
// go-json fails or panics, and DecodeTask then decodes again with
// encoding/json for its error. A task with 200,000 inline recipients took
// encoding/json a sixth of a second, all of it before ingest accepts it.
func decodeTaskFast(data []byte) (t *Task, ok bool) {
	defer func() {
		if recover() != nil {
			t, ok = nil, false
		}
	}()
	dec := gojson.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var task Task
	if dec.Decode(&task) != nil {
		return nil, false
	}
	if rest := data[min(int(dec.InputOffset()), len(data)):]; len(bytes.TrimSpace(rest)) != 0 {
		return nil, false
	}
	return &task, true
}

// DecodeJob decodes a job message.
func DecodeJob(data []byte, job *Job) error { return decode(data, job) }

// DecodeEvent decodes an event message.
func DecodeEvent(data []byte, ev *Event) error { return decode(data, ev) }

// DecodeRecipient decodes one line of a JSON Lines recipient list.
func DecodeRecipient(data []byte, r *Recipient) error { return decode(data, r) }

// DecodeRenderBatch decodes a render batch message.
func DecodeRenderBatch(data []byte, b *RenderBatch) error { return decode(data, b) }

// EncodeRenderBatch encodes a render batch message.
func EncodeRenderBatch(b *RenderBatch) ([]byte, error) { return encodeFast(b) }

// EncodeJob encodes a job message.
func EncodeJob(job *Job) ([]byte, error) { return encodeFast(job) }

// EncodeEvent encodes an event message.
func EncodeEvent(ev *Event) ([]byte, error) {
	if b, ok := appendEvent(make([]byte, 0, eventSizeHint(ev)), ev); ok {
		return b, nil
	}
	return encodeFast(ev)
}

// EncodeLookupEntry encodes a recipient index entry.
func EncodeLookupEntry(e *LookupEntry) ([]byte, error) { return encodeFast(e) }

func encodeFast(v any) (data []byte, err error) {
	defer func() {
		if recover() != nil {
			data, err = json.Marshal(v)
		}
	}()
	return gojson.Marshal(v)
}
