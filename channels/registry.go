package channels

import (
	"fmt"
	"sort"
	"strings"
)

// Registry maps channel names to adapters.
type Registry map[string]Channel

// Builtin returns every channel this build supports, free to connect
// anywhere.
func Builtin() Registry { return BuiltinWith(NetPolicy{}) }

// BuiltinWith returns every channel this build supports, connecting only
// where p allows.
func BuiltinWith(p NetPolicy) Registry {
	r := Registry{}
	for _, c := range []Channel{Webhook{Net: p}, Sandbox{}, WhatsApp{Net: p}, WxPusher{Net: p}, SMTP{Net: p}} {
		r[c.Name()] = c
	}
	return r
}

// Get returns the named channel or an error listing the known ones.
func (r Registry) Get(name string) (Channel, error) {
	if c, ok := r[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("unknown channel %q (known: %s)", name, strings.Join(r.Names(), ", "))
}

// Names lists the channels, sorted.
func (r Registry) Names() []string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
