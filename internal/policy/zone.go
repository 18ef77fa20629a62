package policy

import (
	"sync"
	"time"

	"github.com/nyaruka/phonenumbers"

	"github.com/broadcastd/broadcast/contract"
)

// VarTZ is the recipient variable that names its IANA time zone.
const VarTZ = "tz"

// Zone is the recipient's time zone for quiet hours, and where it came
// from ("tz", "defaults.tz", "phone", "default"), the first that applies:
// the recipient's variable tz when it names a known IANA zone; the task's
// (taskTZ, its defaults' tz) likewise; the zone of the phone number's
// region when to parses as an international number (+ and digits; the
// first zone the numbering plan lists for its longest known prefix);
// fallback. A tz that names no zone is ignored, not an error: the policy
// must not fail a send.
func Zone(vars map[string]any, taskTZ, to string, fallback *time.Location) (*time.Location, string) {
	if s, ok := vars[VarTZ].(string); ok && s != "" {
		if loc, err := loadCached(s); err == nil {
			return loc, "tz"
		}
	}
	if taskTZ != "" {
		if loc, err := loadCached(taskTZ); err == nil {
			return loc, "defaults.tz"
		}
	}
	if loc := phoneZone(to); loc != nil {
		return loc, "phone"
	}
	return fallback, "default"
}

// phoneZone is the zone of an international phone number's prefix, nil
// when to is not one or its zone is unknown.
func phoneZone(to string) *time.Location {
	if len(to) < 8 || to[0] != '+' {
		return nil
	}
	for _, c := range to[1:] {
		if c < '0' || c > '9' {
			return nil
		}
	}
	// An E.164 string is what GetTimezonesForNumber would format a parsed
	// number into; matching its prefix directly skips the parse, which
	// cost 11 µs a recipient (BenchmarkZone).
	zones, err := phonenumbers.GetTimezonesForPrefix(to)
	if err != nil {
		return nil
	}
	for _, z := range zones {
		if z == phonenumbers.UNKNOWN_TIMEZONE {
			continue
		}
		if loc, err := loadCached(z); err == nil {
			return loc
		}
	}
	return nil
}

// zones caches loaded locations (time.LoadLocation reads the zone
// database each call); names that load are few, and failures are not
// cached, so a recipient variable cannot grow it without bound.
var zones sync.Map // name -> *time.Location

func loadCached(name string) (*time.Location, error) {
	if v, ok := zones.Load(name); ok {
		return v.(*time.Location), nil
	}
	loc, err := contract.LoadZone(name)
	if err != nil {
		return nil, err
	}
	zones.Store(name, loc)
	return loc, nil
}
