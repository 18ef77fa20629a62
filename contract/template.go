package contract

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"text/template"
	"text/template/parse"
	"time"
)

// MaxBodyBytes caps one rendered message. A template that produces more is an
// error for that recipient, so a hostile template cannot fill memory.
const MaxBodyBytes = 64 << 10

// Limits on executing one template for one recipient. Templates come from
// whoever may publish tasks, so a loop that never writes (where
// MaxBodyBytes does not help), a value doubled in a loop, or a template that
// calls itself must end with an error rather than hold a render worker or
// fill memory.
const (
	// MaxRenderTime bounds executing a template once, in wall-clock time.
	// MaxTemplateSteps is the deterministic bound; this one is the backstop
	// for steps that are each expensive. It is generous because a skip is
	// final: a legitimate template must not fail because the process was
	// starved of CPU for a moment (GC, a container's CPU quota).
	MaxRenderTime = time.Second
	// MaxTemplateSteps bounds the loop iterations plus template calls of one
	// execution.
	MaxTemplateSteps = 100_000
	// MaxTemplateRange is the largest integer a template may range over
	// literally ({{range 1000}}); a larger constant could never finish within
	// MaxTemplateSteps, so it is rejected at parse time.
	MaxTemplateRange = MaxTemplateSteps
	// MaxTemplateValueBytes caps a string built inside a template by print,
	// printf, println, html, js or urlquery. It is checked before the
	// string is built, from the arguments (template_cost.go).
	MaxTemplateValueBytes = MaxBodyBytes
	// MaxTemplateBuiltBytes caps what those builtins build in one
	// execution together: each value under MaxTemplateValueBytes, kept in
	// thousands of variables, held 200 MB.
	MaxTemplateBuiltBytes = 1 << 20
	// MaxPrintfWidth bounds a printf width or precision ("%999999d" asks
	// fmt for a megabyte of padding).
	MaxPrintfWidth = 4096
	// MaxTemplateArgs bounds the arguments of one call of a builtin that
	// builds a string.
	MaxTemplateArgs = 256
)

// ErrBodyTooLarge is returned when rendering would exceed MaxBodyBytes.
var ErrBodyTooLarge = fmt.Errorf("rendered message exceeds %d bytes", MaxBodyBytes)

// ErrRenderTimeout is returned when executing a template takes longer than
// MaxRenderTime.
var ErrRenderTimeout = fmt.Errorf("execution exceeded %s", MaxRenderTime)

// ErrRenderSteps is returned when an execution exceeds MaxTemplateSteps.
var ErrRenderSteps = fmt.Errorf("execution exceeded %d loop iterations and template calls", MaxTemplateSteps)

// ErrNoValue is returned when a template would print text/template's
// "<no value>" for something missing that missingkey=error does not catch:
// an index of a missing map key, a variable that is null. A recipient
// must never receive that text.
var ErrNoValue = errors.New(`a value is missing or null (index of a missing key, or a null variable): the message would contain "<no value>"`)

// noValue is what text/template prints for a missing or nil value.
const noValue = "<no value>"

// tickFunc is the function instrumented templates call at the top of every
// range body and every template: it counts steps and checks the clock.
const tickFunc = "broadcastStep"

// Template is a parsed message template. It is safe for concurrent use.
type Template struct {
	tmpl *template.Template
	// literalNoValue: the source itself contains "<no value>", so the
	// output may too.
	literalNoValue bool
	// plain is set for a template of only text and {{.name}} fields (most
	// are): Render fills those directly when every field is a string,
	// without executing the template (2 µs a recipient).
	plain []plainPart
	// runs holds clones of tmpl, each bound to its own budget, so
	// concurrent renders never share a step count.
	runs sync.Pool
}

// run is one clone of the template and the budget its step function checks.
type run struct {
	tmpl   *template.Template
	budget *budget
}

// budget is the time, steps and built bytes one execution may still use.
type budget struct {
	deadline time.Time
	steps    int
	built    int // bytes print, printf, ... built so far (charge)
}

func (b *budget) step() (string, error) {
	b.steps++
	if b.steps > MaxTemplateSteps {
		return "", ErrRenderSteps
	}
	// Reading the clock every step would cost more than the step itself.
	if b.steps%64 == 0 && time.Now().After(b.deadline) {
		return "", ErrRenderTimeout
	}
	return "", nil
}

// baseFuncs replaces the builtins that build strings with bounded
// versions (template_cost.go), and declares the step function. Each
// execution's clone binds both to its own budget.
func baseFuncs() template.FuncMap {
	f := builtinFuncs(nil)
	f[tickFunc] = func() (string, error) { return "", nil }
	return f
}

// ParseTemplate parses src as Go text/template with missingkey=error, so a
// recipient lacking a variable fails instead of receiving "<no value>". It
// rejects templates that call themselves and ranges over an integer constant
// above MaxTemplateRange, naming the reason.
func ParseTemplate(src string) (*Template, error) {
	t, err := template.New("message").Option("missingkey=error").Funcs(baseFuncs()).Parse(src)
	if err != nil {
		// Drop the "template: message:" prefix; the field name says where.
		msg := strings.TrimPrefix(err.Error(), "template: ")
		return nil, errors.New(msg)
	}
	if err := checkTree(t); err != nil {
		return nil, err
	}
	plain := plainParts(t)
	instrument(t)
	out := &Template{tmpl: t, plain: plain, literalNoValue: strings.Contains(src, noValue)}
	out.runs.New = func() any {
		b := &budget{}
		c := template.Must(t.Clone())
		f := builtinFuncs(b)
		f[tickFunc] = b.step
		c.Funcs(f)
		return &run{tmpl: c, budget: b}
	}
	return out, nil
}

// Render executes the template over defaults merged with vars (vars win)
// plus "to". The error names the missing variable when there is one, and is
// ErrBodyTooLarge, ErrRenderTimeout, ErrRenderSteps or matches
// ErrTemplateCost when a limit was hit (isLimit).
func (t *Template) Render(defaults, vars map[string]any, to string) (string, error) {
	if t.plain != nil {
		if body, ok := renderPlain(t.plain, defaults, vars, to); ok {
			return body, nil
		}
	}
	return t.execute(defaults, vars, to)
}

// RenderEscaped is Render with every string of the data (defaults, vars
// and "to", inside maps and lists too) passed through escape first, the
// template's own text untouched: for bodies sent as HTML, where a
// recipient's name must not become markup (html.EscapeString).
func (t *Template) RenderEscaped(defaults, vars map[string]any, to string, escape func(string) string) (string, error) {
	d, _ := escapeStrings(defaults, escape).(map[string]any)
	v, _ := escapeStrings(vars, escape).(map[string]any)
	return t.Render(d, v, escape(to))
}

// escapeStrings returns v with escape applied to every string in it, as a
// copy (the recipient's own variables are kept as they are for the job).
func escapeStrings(v any, escape func(string) string) any {
	switch v := v.(type) {
	case string:
		return escape(v)
	case map[string]any:
		if v == nil {
			return v
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = escapeStrings(e, escape)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = escapeStrings(e, escape)
		}
		return out
	}
	return v
}

// execute runs the template itself.
func (t *Template) execute(defaults, vars map[string]any, to string) (string, error) {
	data := make(map[string]any, len(defaults)+len(vars)+1)
	maps.Copy(data, defaults)
	maps.Copy(data, vars)
	data["to"] = to
	r := t.runs.Get().(*run)
	defer t.runs.Put(r)
	r.budget.deadline, r.budget.steps, r.budget.built = time.Now().Add(MaxRenderTime), 0, 0
	var b limitedBuilder
	if err := r.tmpl.Execute(&b, data); err != nil {
		for _, limit := range []error{ErrBodyTooLarge, ErrRenderTimeout, ErrRenderSteps} {
			if errors.Is(err, limit) {
				return "", limit
			}
		}
		// The builtin's own words, without text/template's "executing
		// ... at <printf ...>", which quotes up to the whole call.
		if ce := (*costError)(nil); errors.As(err, &ce) {
			return "", ce
		}
		return "", errors.New(strings.TrimPrefix(err.Error(), "template: "))
	}
	out := b.String()
	if strings.Contains(out, noValue) && !t.literalNoValue && !containsNoValue(data) {
		return "", ErrNoValue
	}
	return out, nil
}

// containsNoValue reports whether a variable's text holds "<no value>"
// (then the output may, rightly). Walked only when the output has it.
func containsNoValue(v any) bool {
	switch v := v.(type) {
	case string:
		return strings.Contains(v, noValue)
	case map[string]any:
		for _, e := range v {
			if containsNoValue(e) {
				return true
			}
		}
	case []any:
		for _, e := range v {
			if containsNoValue(e) {
				return true
			}
		}
	}
	return false
}

// plainPart is literal text, or the name of a field to fill in.
type plainPart struct {
	text  string
	field string
}

// plainParts returns the parts of a template that is only text and
// {{.name}} fields, or nil.
func plainParts(t *template.Template) []plainPart {
	if len(t.Templates()) != 1 || t.Tree == nil || t.Tree.Root == nil {
		return nil
	}
	parts := []plainPart{}
	for _, n := range t.Tree.Root.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			parts = append(parts, plainPart{text: string(n.Text)})
		case *parse.ActionNode:
			if len(n.Pipe.Decl) > 0 || len(n.Pipe.Cmds) != 1 || len(n.Pipe.Cmds[0].Args) != 1 {
				return nil
			}
			f, ok := n.Pipe.Cmds[0].Args[0].(*parse.FieldNode)
			if !ok || len(f.Ident) != 1 {
				return nil
			}
			parts = append(parts, plainPart{field: f.Ident[0]})
		default:
			return nil
		}
	}
	return parts
}

// renderPlain fills a plain template the way text/template would (vars
// win over defaults, "to" over both). It declines (ok false) whenever the
// result might differ: a missing field (an error) or one that is not a
// string (printed by text/template's rules), or a too long body.
func renderPlain(parts []plainPart, defaults, vars map[string]any, to string) (string, bool) {
	var b strings.Builder
	for _, p := range parts {
		if p.field == "" {
			b.WriteString(p.text)
			continue
		}
		var v any
		var found bool
		if p.field == "to" {
			v, found = to, true
		} else if v, found = vars[p.field]; !found {
			v, found = defaults[p.field]
		}
		s, isString := v.(string)
		if !found || !isString {
			return "", false
		}
		b.WriteString(s)
	}
	if b.Len() > MaxBodyBytes {
		return "", false
	}
	return b.String(), true
}

// limitedBuilder is a strings.Builder that refuses to grow past MaxBodyBytes.
type limitedBuilder struct{ strings.Builder }

func (b *limitedBuilder) Write(p []byte) (int, error) {
	if b.Len()+len(p) > MaxBodyBytes {
		return 0, ErrBodyTooLarge
	}
	return b.Builder.Write(p)
}

// checkTree rejects what no execution budget needs to find out: a range over
// a too large integer constant, and templates that call themselves, directly
// or through others (each call would take stack until text/template's depth
// limit of 100,000).
func checkTree(t *template.Template) error {
	calls := map[string][]string{}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		var err error
		walk(tt.Tree.Root, func(n parse.Node) {
			switch n := n.(type) {
			case *parse.RangeNode:
				if k := rangeConstant(n); k > MaxTemplateRange && err == nil {
					err = fmt.Errorf("range over %d exceeds the limit of %d loop iterations", k, MaxTemplateRange)
				}
			case *parse.TemplateNode:
				calls[tt.Name()] = append(calls[tt.Name()], n.Name)
			case *parse.CommandNode:
				if cerr := checkBuiltinCall(n); cerr != nil && err == nil {
					err = cerr
				}
			}
		})
		if err != nil {
			return err
		}
	}
	// Depth-first search for a cycle in the call graph.
	const (
		unseen = iota
		active
		done
	)
	state := map[string]int{}
	var visit func(name string) string
	visit = func(name string) string {
		switch state[name] {
		case active:
			return name
		case done:
			return ""
		}
		state[name] = active
		for _, callee := range calls[name] {
			if c := visit(callee); c != "" {
				return c
			}
		}
		state[name] = done
		return ""
	}
	for name := range calls {
		if c := visit(name); c != "" {
			return fmt.Errorf("template %q calls itself: recursive templates are not allowed", c)
		}
	}
	return nil
}

// checkBuiltinCall refuses at parse time what a string builder would
// refuse on every execution: too many arguments, and a literal printf
// format with a width or precision above MaxPrintfWidth.
func checkBuiltinCall(n *parse.CommandNode) error {
	if len(n.Args) == 0 {
		return nil
	}
	id, ok := n.Args[0].(*parse.IdentifierNode)
	if !ok {
		return nil
	}
	switch id.Ident {
	case "print", "println", "html", "js", "urlquery":
		return checkArgs(id.Ident, make([]any, len(n.Args)-1))
	case "printf":
		if len(n.Args) < 2 {
			return nil
		}
		if err := checkArgs(id.Ident, make([]any, len(n.Args)-2)); err != nil {
			return err
		}
		if format, ok := n.Args[1].(*parse.StringNode); ok {
			_, err := printfBound(format.Text, nil, MaxTemplateValueBytes)
			return err
		}
	}
	return nil
}

// rangeConstant is the integer a range iterates over when its pipeline is a
// lone number literal, else 0.
func rangeConstant(r *parse.RangeNode) int64 {
	if r.Pipe == nil || len(r.Pipe.Cmds) != 1 || len(r.Pipe.Cmds[0].Args) != 1 {
		return 0
	}
	num, ok := r.Pipe.Cmds[0].Args[0].(*parse.NumberNode)
	switch {
	case !ok:
		return 0
	case num.IsInt:
		return num.Int64
	case num.IsUint:
		return int64(min(num.Uint64, 1<<62))
	case num.IsFloat:
		return int64(min(num.Float64, 1<<62))
	}
	return 0
}

// instrument puts a call to the step function at the top of every range
// body and every template, so that work between two steps is bounded by the
// template's size (MaxTemplateBytes) and the budget bounds the rest.
func instrument(t *template.Template) {
	stepNode := func(pos parse.Pos) parse.Node {
		cmd := &parse.CommandNode{NodeType: parse.NodeCommand, Pos: pos,
			Args: []parse.Node{&parse.IdentifierNode{NodeType: parse.NodeIdentifier, Pos: pos, Ident: tickFunc}}}
		pipe := &parse.PipeNode{NodeType: parse.NodePipe, Pos: pos, Cmds: []*parse.CommandNode{cmd}}
		return &parse.ActionNode{NodeType: parse.NodeAction, Pos: pos, Pipe: pipe}
	}
	prepend := func(l *parse.ListNode) {
		if l != nil {
			l.Nodes = append([]parse.Node{stepNode(l.Pos)}, l.Nodes...)
		}
	}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		walk(tt.Tree.Root, func(n parse.Node) {
			if r, ok := n.(*parse.RangeNode); ok {
				prepend(r.List)
			}
		})
		prepend(tt.Tree.Root)
	}
}

// walk calls fn on n and every node below it.
func walk(n parse.Node, fn func(parse.Node)) {
	if n == nil {
		return
	}
	fn(n)
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walk(c, fn)
		}
	case *parse.IfNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.RangeNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.WithNode:
		walkBranch(&n.BranchNode, fn)
	case *parse.ActionNode:
		walk(n.Pipe, fn)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, c := range n.Cmds {
			walk(c, fn)
		}
	case *parse.CommandNode:
		for _, a := range n.Args {
			walk(a, fn)
		}
	case *parse.TemplateNode:
		walk(n.Pipe, fn)
	}
}

func walkBranch(b *parse.BranchNode, fn func(parse.Node)) {
	walk(b.Pipe, fn)
	if b.List != nil {
		walk(b.List, fn)
	}
	if b.ElseList != nil {
		walk(b.ElseList, fn)
	}
}
