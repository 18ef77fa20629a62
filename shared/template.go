package shared

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"text/template"
)

// MaxBodyBytes caps one rendered message. A template that produces more is an
// error for that recipient, so a hostile template cannot fill memory.
const MaxBodyBytes = 64 << 10

// ErrBodyTooLarge is returned when rendering would exceed MaxBodyBytes.
var ErrBodyTooLarge = fmt.Errorf("rendered message exceeds %d bytes", MaxBodyBytes)

// Template is a parsed message template. It is safe for concurrent use.
type Template struct {
	tmpl *template.Template
}

// ParseTemplate parses src as Go text/template with missingkey=error, so a
// recipient lacking a variable fails instead of receiving "<no value>".
func ParseTemplate(src string) (*Template, error) {
	t, err := template.New("message").Option("missingkey=error").Parse(src)
	if err != nil {
		// Drop the "template: message:" prefix; the field name says where.
		msg := strings.TrimPrefix(err.Error(), "template: ")
		return nil, errors.New(msg)
	}
	return &Template{tmpl: t}, nil
}

// Render executes the template over defaults merged with vars (vars win)
// plus "to". The error names the missing variable when there is one.
func (t *Template) Render(defaults, vars map[string]any, to string) (string, error) {
	data := make(map[string]any, len(defaults)+len(vars)+1)
	maps.Copy(data, defaults)
	maps.Copy(data, vars)
	data["to"] = to
	var b limitedBuilder
	if err := t.tmpl.Execute(&b, data); err != nil {
		if errors.Is(err, ErrBodyTooLarge) {
			return "", ErrBodyTooLarge
		}
		return "", errors.New(strings.TrimPrefix(err.Error(), "template: "))
	}
	return b.String(), nil
}

// limitedBuilder is a strings.Builder that refuses to grow past MaxBodyBytes.
type limitedBuilder struct{ strings.Builder }

func (b *limitedBuilder) Write(p []byte) (int, error) {
	if b.Len()+len(p) > MaxBodyBytes {
		return 0, ErrBodyTooLarge
	}
	return b.Builder.Write(p)
}
