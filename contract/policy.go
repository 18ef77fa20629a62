package contract

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// BucketPolicy holds the recipient policy: key PolicyDefault or a channel
// name, value a Policy. A channel's key, when present, replaces the
// default for that channel as a whole (no field-by-field merge).
const BucketPolicy = "broadcast_policy"

// PolicyDefault is the key of the policy for channels without their own.
const PolicyDefault = "default"

// BucketFrequency holds the per-recipient send counts behind the
// frequency caps (internal): key <channel>.<hex SHA-256 of the normalized
// recipient>, value a FrequencyRecord. Its TTL is MaxCapWindow.
const BucketFrequency = "broadcast_frequency"

// MaxCapWindow is the longest frequency cap window accepted, and the age
// after which a recipient's counts are dropped.
const MaxCapWindow = 31 * 24 * time.Hour

// Skip and wait codes of the policy.
const (
	// CodeFrequencyCap is the code of a skipped event of a recipient
	// over a frequency cap.
	CodeFrequencyCap = "frequency_cap"
	// CodeQuietHours is the code of a retrying event of a job held until
	// its recipient's quiet hours end.
	CodeQuietHours = "quiet_hours"
)

// Policy is a value of KV broadcast_policy.
type Policy struct {
	// FrequencyCaps limit the messages one recipient gets on the channel
	// across tasks; every cap that applies must have room.
	FrequencyCaps []FrequencyCap `json:"frequency_caps,omitempty"`
	// QuietHours, when set, holds messages while it is night for the
	// recipient.
	QuietHours *QuietHours `json:"quiet_hours,omitempty"`
}

// FrequencyCap allows at most Max messages of its categories to one
// recipient within any Window. Without a category it applies to, and
// counts, every category but transactional, which bypasses caps.
type FrequencyCap struct {
	Category   Category   `json:"category,omitempty"`
	Categories []Category `json:"categories,omitempty"`
	Max        int        `json:"max"`
	// Window is a Go duration, e.g. "24h", at most MaxCapWindow.
	Window string `json:"window"`

	window time.Duration
}

// QuietHours is a daily window, in the recipient's local time, in which
// messages of its categories wait. Start after End spans midnight.
type QuietHours struct {
	// Start and End are "HH:MM", 24-hour clock.
	Start string `json:"start"`
	End   string `json:"end"`
	// DefaultTZ is the IANA zone of recipients whose zone is unknown;
	// empty means UTC.
	DefaultTZ string `json:"default_tz,omitempty"`
	// Categories it applies to; empty means all but transactional.
	Categories []Category `json:"categories,omitempty"`

	start, end int // minutes after midnight
	defaultLoc *time.Location
}

// DecodePolicy parses and validates a policy value; errors name the field.
func DecodePolicy(data []byte) (*Policy, error) {
	var p Policy
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate checks the policy, naming the bad field, and prepares its
// parsed windows, times and zone.
func (p *Policy) Validate() error {
	for i := range p.FrequencyCaps {
		if err := p.FrequencyCaps[i].validate(fmt.Sprintf("frequency_caps[%d]", i)); err != nil {
			return err
		}
	}
	if q := p.QuietHours; q != nil {
		if err := q.validate(); err != nil {
			return err
		}
	}
	return nil
}

func (c *FrequencyCap) validate(field string) error {
	if c.Max < 1 {
		return fieldErr(field+".max", "must be at least 1, got %d", c.Max)
	}
	d, err := time.ParseDuration(c.Window)
	if err != nil {
		return fieldErr(field+".window", "want a Go duration such as \"24h\", got %q", truncate(c.Window, 40))
	}
	if d <= 0 || d > MaxCapWindow {
		return fieldErr(field+".window", "must be above 0 and at most %s, got %s", MaxCapWindow, d)
	}
	c.window = d
	if c.Category != "" {
		if err := policyCategory(field+".category", c.Category); err != nil {
			return err
		}
	}
	for i, cat := range c.Categories {
		if err := policyCategory(fmt.Sprintf("%s.categories[%d]", field, i), cat); err != nil {
			return err
		}
	}
	return nil
}

func (q *QuietHours) validate() error {
	var err error
	if q.start, err = clockMinutes(q.Start); err != nil {
		return fieldErr("quiet_hours.start", "%v", err)
	}
	if q.end, err = clockMinutes(q.End); err != nil {
		return fieldErr("quiet_hours.end", "%v", err)
	}
	if q.start == q.end {
		return fieldErr("quiet_hours.end", "equals start (%s): the window would be empty", q.Start)
	}
	q.defaultLoc = time.UTC
	if q.DefaultTZ != "" {
		loc, err := LoadZone(q.DefaultTZ)
		if err != nil {
			return fieldErr("quiet_hours.default_tz", "%v", err)
		}
		q.defaultLoc = loc
	}
	for i, cat := range q.Categories {
		if err := policyCategory(fmt.Sprintf("quiet_hours.categories[%d]", i), cat); err != nil {
			return err
		}
	}
	return nil
}

// LoadZone loads an IANA zone by name, refusing "Local" and names the
// zone database does not know.
func LoadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" || len(name) > 64 {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as \"Asia/Shanghai\")", truncate(name, 64))
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (want an IANA name such as \"Asia/Shanghai\")", truncate(name, 64))
	}
	return loc, nil
}

// policyCategory accepts marketing and utility: transactional messages
// bypass caps and quiet hours, so a rule naming it is a mistake.
func policyCategory(field string, c Category) error {
	if c == CategoryTransactional {
		return fieldErr(field, "transactional messages bypass caps and quiet hours; name marketing or utility")
	}
	if !ValidCategory(c) {
		return fieldErr(field, "must be marketing or utility, got %q", truncate(string(c), 40))
	}
	return nil
}

// clockMinutes parses "HH:MM" into minutes after midnight.
func clockMinutes(s string) (int, error) {
	t, err := time.Parse("15:04", s)
	if err != nil || len(s) != 5 {
		return 0, fmt.Errorf("want HH:MM on a 24-hour clock, got %q", truncate(s, 20))
	}
	return t.Hour()*60 + t.Minute(), nil
}

// appliesTo reports whether a rule naming cats (empty: all but
// transactional) applies to category c.
func appliesTo(cats []Category, c Category) bool {
	if c == CategoryTransactional {
		return false
	}
	return len(cats) == 0 || slices.Contains(cats, c)
}

// categories is the cap's categories, Category and Categories together.
func (c *FrequencyCap) categories() []Category {
	if c.Category == "" {
		return c.Categories
	}
	return append([]Category{c.Category}, c.Categories...)
}

// Applies reports whether the cap limits messages of category c.
func (c *FrequencyCap) Applies(cat Category) bool { return appliesTo(c.categories(), cat) }

// WindowDuration is the cap's parsed window (after Validate).
func (c *FrequencyCap) WindowDuration() time.Duration { return c.window }

// Describe names the cap for an event's error, e.g. "marketing: 2 per 24h0m0s".
func (c *FrequencyCap) Describe() string {
	cats := "all but transactional"
	if cs := c.categories(); len(cs) > 0 {
		names := make([]string, len(cs))
		for i, x := range cs {
			names[i] = string(x)
		}
		cats = strings.Join(names, ",")
	}
	return fmt.Sprintf("%s: %d per %s", cats, c.Max, c.window)
}

// Applies reports whether quiet hours hold messages of category c.
func (q *QuietHours) Applies(c Category) bool { return appliesTo(q.Categories, c) }

// DefaultLocation is the zone of recipients whose zone is unknown (after
// Validate): DefaultTZ, or UTC.
func (q *QuietHours) DefaultLocation() *time.Location {
	if q.defaultLoc == nil {
		return time.UTC
	}
	return q.defaultLoc
}

// Until reports whether now, read in loc, is inside the quiet hours, and
// if so when they end (the first End after now, in loc).
func (q *QuietHours) Until(now time.Time, loc *time.Location) (time.Time, bool) {
	local := now.In(loc)
	m := local.Hour()*60 + local.Minute()
	inside := q.start < q.end && m >= q.start && m < q.end ||
		q.start > q.end && (m >= q.start || m < q.end)
	if !inside {
		return time.Time{}, false
	}
	y, mo, d := local.Date()
	end := time.Date(y, mo, d, q.end/60, q.end%60, 0, 0, loc)
	if !end.After(local) {
		end = time.Date(y, mo, d+1, q.end/60, q.end%60, 0, 0, loc)
	}
	return end, true
}

// FrequencyRecord is a value of KV broadcast_frequency: the sends
// reserved for one recipient on one channel, newest last, kept while the
// longest cap window may still count them.
type FrequencyRecord struct {
	Sends []FrequencySend `json:"sends"`
}

// FrequencySend is one reserved send: by job id (a redelivery or retry of
// the same job finds its reservation instead of taking a second), its
// category and when it was reserved (Unix seconds). A digest carrying
// items of several categories is one send: Category is the strictest of
// them (marketing before utility) and Also the others, so it counts once
// under every cap that limits any of them.
type FrequencySend struct {
	Job      string     `json:"job"`
	Category Category   `json:"cat"`
	Also     []Category `json:"also,omitempty"`
	At       int64      `json:"at"`
}

// CountsFor reports whether the send counts under cap c.
func (s *FrequencySend) CountsFor(c *FrequencyCap) bool {
	return c.Applies(s.Category) || slices.ContainsFunc(s.Also, c.Applies)
}

// Covers reports whether the send counts for every category in cats.
func (s *FrequencySend) Covers(cats []Category) bool {
	for _, c := range cats {
		if c != s.Category && !slices.Contains(s.Also, c) {
			return false
		}
	}
	return true
}
