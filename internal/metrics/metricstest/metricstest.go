// Package metricstest scrapes a /metrics endpoint in tests and reads
// samples by name and labels.
package metricstest

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// Samples are the metric families of one scrape, by name.
type Samples map[string]*dto.MetricFamily

// Scrape GETs url and parses the Prometheus text format.
func Scrape(t testing.TB, url string) Samples {
	t.Helper()
	res, err := http.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, url)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(res.Body)
	require.NoError(t, err, "parse %s", url)
	return Samples(fams)
}

// Sum adds the values (counter, gauge, or a histogram's sample count) of
// every series of name whose labels include labels ("name", "value" pairs).
// A missing family sums to 0.
func (s Samples) Sum(name string, labels ...string) float64 {
	fam := s[name]
	if fam == nil {
		return 0
	}
	var sum float64
	for _, m := range fam.GetMetric() {
		if matches(m, labels) {
			sum += value(m)
		}
	}
	return sum
}

// Has reports whether a series of name with labels exists.
func (s Samples) Has(name string, labels ...string) bool {
	fam := s[name]
	if fam == nil {
		return false
	}
	for _, m := range fam.GetMetric() {
		if matches(m, labels) {
			return true
		}
	}
	return false
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	case m.Untyped != nil:
		return m.GetUntyped().GetValue()
	}
	return 0
}
