package contract

import (
	"fmt"
	"reflect"
	"strings"
	"text/template"
	"unicode/utf8"
)

// The builtins that build strings (print, printf, println, html, js,
// urlquery) are bounded before they build anything: fmt assembles the whole
// result in memory before returning it, so checking its length afterwards
// (as this package once did) let one call of printf "%999999d" repeated
// 300 times allocate 1.7 GB. Each call's result is bounded from its
// arguments first, and refused when the bound passes
// MaxTemplateValueBytes; every execution's built strings together are
// bounded by MaxTemplateBuiltBytes.

// ErrTemplateCost is matched (errors.Is) by every error that refuses work a
// template asked for because of its size: a builtin's arguments or result
// above MaxTemplateValueBytes, a width or precision above MaxPrintfWidth,
// more than MaxTemplateArgs arguments, or more than MaxTemplateBuiltBytes
// built in one execution. Validate rejects a task whose template does this
// on its trial render.
var ErrTemplateCost = fmt.Errorf("template exceeds a size limit")

// costError is an error that matches ErrTemplateCost.
type costError struct{ msg string }

func (e *costError) Error() string        { return e.msg }
func (e *costError) Is(target error) bool { return target == ErrTemplateCost }

func costErr(format string, args ...any) error {
	return &costError{msg: fmt.Sprintf(format, args...)}
}

// builtinFuncs are the string builders, bound to one execution's budget b
// (nil at parse time, where only their names and signatures count).
func builtinFuncs(b *budget) template.FuncMap {
	sprint := func(name string, f func(...any) string, newline bool) func(...any) (string, error) {
		return func(args ...any) (string, error) {
			if _, err := printBound(name, args, newline); err != nil {
				return "", err
			}
			s := f(args...)
			return s, b.charge(name, len(s))
		}
	}
	// The escapers print their arguments first (a lone string as it is),
	// then escape: the input is bounded like print's, and the output, at
	// most 6 times the input, is checked once built.
	escape := func(name string, f func(...any) string) func(...any) (string, error) {
		return func(args ...any) (string, error) {
			if _, err := printBound(name, args, false); err != nil {
				return "", err
			}
			s := f(args...)
			if len(s) > MaxTemplateValueBytes {
				return "", costErr("%s: result exceeds %d bytes", name, MaxTemplateValueBytes)
			}
			return s, b.charge(name, len(s))
		}
	}
	return template.FuncMap{
		"print":   sprint("print", fmt.Sprint, false),
		"println": sprint("println", fmt.Sprintln, true),
		"printf": func(format string, args ...any) (string, error) {
			if err := checkArgs("printf", args); err != nil {
				return "", err
			}
			n, err := printfBound(format, args, MaxTemplateValueBytes)
			if err != nil {
				return "", err
			}
			if n > MaxTemplateValueBytes {
				return "", costErr("printf: result would exceed %d bytes", MaxTemplateValueBytes)
			}
			s := fmt.Sprintf(format, args...)
			return s, b.charge("printf", len(s))
		},
		"html":     escape("html", template.HTMLEscaper),
		"js":       escape("js", template.JSEscaper),
		"urlquery": escape("urlquery", template.URLQueryEscaper),
	}
}

// printBound bounds what fmt.Sprint (or Sprintln) writes for args: each
// operand as %v, a space between operands, a newline.
func printBound(name string, args []any, newline bool) (int, error) {
	if err := checkArgs(name, args); err != nil {
		return 0, err
	}
	n := len(args)
	if newline {
		n++
	}
	for _, a := range args {
		if n += valueBound(a, spec{verb: 'v'}, MaxTemplateValueBytes-n, 0); n > MaxTemplateValueBytes {
			return 0, costErr("%s: result would exceed %d bytes", name, MaxTemplateValueBytes)
		}
	}
	return n, nil
}

// charge counts the n bytes a builtin built against the execution's
// MaxTemplateBuiltBytes. Each call is bounded before it builds, so the
// execution holds at most MaxTemplateValueBytes more than the limit.
func (b *budget) charge(name string, n int) error {
	if b == nil {
		return nil
	}
	b.built += n
	if b.built > MaxTemplateBuiltBytes {
		return costErr("%s: this message's print, printf, println, html, js and urlquery calls built more than %d bytes", name, MaxTemplateBuiltBytes)
	}
	return nil
}

func checkArgs(name string, args []any) error {
	if len(args) > MaxTemplateArgs {
		return costErr("%s: %d arguments, limit is %d", name, len(args), MaxTemplateArgs)
	}
	return nil
}

// spec is one printf directive as far as its output size goes.
type spec struct {
	verb        rune
	width, prec int
	sharp       bool
}

// printfBound returns an upper bound on len(fmt.Sprintf(format, args...)),
// or more than limit once it is clear the result would exceed it. It walks
// the format as fmt's doPrintf does (flags, argument indexes, widths and
// precisions given as digits or by '*', the verbs that take no operand),
// and refuses a width or precision above MaxPrintfWidth. Only the operands
// a directive formats are measured, each no further than the limit, so
// bounding costs at most about what the bound allows.
func printfBound(format string, args []any, limit int) (int, error) {
	total, argNum, reordered := 0, 0, false
	end := len(format)
	for i := 0; i < end; {
		lasti := i
		for i < end && format[i] != '%' {
			i++
		}
		total += i - lasti
		if i >= end {
			break
		}
		i++ // the '%'
		var sp spec
	flags:
		for ; i < end; i++ {
			switch format[i] {
			case '#':
				sp.sharp = true
			case '+', '-', ' ', '0':
			default:
				break flags
			}
		}
		good := true
		var after bool
		argNum, i, after = argNumber(argNum, format, i, len(args), &good, &reordered)
		var err error
		if i < end && format[i] == '*' {
			i++
			total += len("%!(BADWIDTH)")
			if sp.width, err = starArg(args, argNum, "width"); err != nil {
				return 0, err
			}
			if argNum < len(args) {
				argNum++
			}
			after = false
		} else {
			var present bool
			sp.width, present, i = parseNum(format, i, end)
			if sp.width > MaxPrintfWidth {
				return 0, costErr("printf: width %d exceeds the limit of %d", sp.width, MaxPrintfWidth)
			}
			if after && present {
				good = false
			}
		}
		if i+1 < end && format[i] == '.' {
			i++
			if after {
				good = false
			}
			argNum, i, after = argNumber(argNum, format, i, len(args), &good, &reordered)
			if i < end && format[i] == '*' {
				i++
				total += len("%!(BADPREC)")
				if sp.prec, err = starArg(args, argNum, "precision"); err != nil {
					return 0, err
				}
				if argNum < len(args) {
					argNum++
				}
				after = false
			} else {
				sp.prec, _, i = parseNum(format, i, end)
				if sp.prec > MaxPrintfWidth {
					return 0, costErr("printf: precision %d exceeds the limit of %d", sp.prec, MaxPrintfWidth)
				}
			}
		}
		if !after {
			argNum, i, _ = argNumber(argNum, format, i, len(args), &good, &reordered)
		}
		if i >= end {
			total += len("%!(NOVERB)")
			break
		}
		verb, size := utf8.DecodeRuneInString(format[i:])
		i += size
		sp.verb = verb
		switch {
		case verb == '%':
			total++
		case !good || argNum >= len(args):
			// %!v(BADINDEX), %!v(MISSING), with the verb's rune.
			total += 16
		case verb == 'w':
			// Sprintf prints a %w operand with 'w', a verb wrong for every
			// type a template has: either each leaf is wrapped
			// ("%!w(uint8=76)" per byte of a []byte) or the whole operand
			// is, printed as %v (as %#v with the '#' flag). Both count.
			asV := sp
			asV.verb = 'v'
			total += wrapperBound + valueBound(args[argNum], asV, limit-total, 0) + valueBound(args[argNum], sp, limit-total, 0)
			argNum++
		default:
			total += valueBound(args[argNum], sp, limit-total, 0)
			argNum++
		}
		if total > limit {
			return total, nil
		}
	}
	if !reordered && argNum < len(args) {
		// %!(EXTRA type=value, ...)
		total += 10
		for _, a := range args[argNum:] {
			total += 2 + typeNameBound + valueBound(a, spec{verb: 'v'}, limit-total, 0)
			if total > limit {
				return total, nil
			}
		}
	}
	return total, nil
}

// argNumber reads an argument index "[n]" at format[i:] as fmt's
// argNumber does: any '[' marks the format reordered, a bad or out of
// range index makes the directive print %!v(BADINDEX).
func argNumber(argNum int, format string, i, numArgs int, good, reordered *bool) (int, int, bool) {
	if len(format) <= i || format[i] != '[' {
		return argNum, i, false
	}
	*reordered = true
	f := format[i:]
	if len(f) < 3 {
		*good = false
		return argNum, i + 1, false
	}
	for j := 1; j < len(f); j++ {
		if f[j] == ']' {
			n, ok, next := parseNum(f, 1, j)
			if !ok || next != j || n > 1e6 {
				*good = false
				return argNum, i + j + 1, false
			}
			if n-1 < 0 || n-1 >= numArgs {
				*good = false
				return argNum, i + j + 1, true
			}
			return n - 1, i + j + 1, true
		}
	}
	*good = false
	return argNum, i + 1, false
}

// parseNum reads a decimal width or precision; values above a million
// (fmt's own limit) read as a million and one.
func parseNum(s string, i, end int) (num int, ok bool, next int) {
	for ; i < end && '0' <= s[i] && s[i] <= '9'; i++ {
		if num <= 1e6 {
			num = num*10 + int(s[i]-'0')
		}
		ok = true
	}
	return min(num, 1e6+1), ok, i
}

// starArg is the width or precision a '*' takes from args[i]: fmt uses an
// integer argument's absolute value and prints %!(BADWIDTH) otherwise.
func starArg(args []any, i int, what string) (int, error) {
	if i >= len(args) {
		return 0, nil
	}
	v := reflect.ValueOf(args[i])
	var n int64
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n = v.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if v.Uint() > MaxPrintfWidth {
			return 0, costErr("printf: %s %d exceeds the limit of %d", what, v.Uint(), MaxPrintfWidth)
		}
		n = int64(v.Uint())
	default:
		return 0, nil
	}
	if n > MaxPrintfWidth || n < -MaxPrintfWidth {
		return 0, costErr("printf: %s %d exceeds the limit of %d", what, n, MaxPrintfWidth)
	}
	return int(max(n, -n)), nil
}

// Bounds of what fmt writes for one value besides its text: a wrong verb's
// "%!d(type=" wrapper, a container's type name (%#v), separators.
const (
	typeNameBound  = 40
	wrapperBound   = 16 + typeNameBound
	containerBound = 4 + typeNameBound
	separatorBound = 4
	maxValueDepth  = 64
)

// valueBound returns an upper bound on what fmt prints for v under sp, or
// more than limit (after walking no further than needed to know that).
// Width applies to every leaf, as fmt pads each element of a slice or map;
// a verb wrong for the leaf's type wraps the padded text in "%!d(type=...)".
func valueBound(v any, sp spec, limit, depth int) int {
	if depth > maxValueDepth {
		return limit + 1
	}
	switch v := v.(type) {
	case nil:
		return leafBound(13, false, sp) // <nil>, or %!d(<nil>) with a verb of up to 4 bytes
	case bool:
		return leafBound(5, !strings.ContainsRune("tv", sp.verb), sp)
	case string:
		return stringBound(len(v), sp)
	case float64, float32:
		return leafBound(numberBound(sp), !strings.ContainsRune(floatVerbs, sp.verb), sp)
	case int, int64, int32, uint, uint64, uint32, uint8, int8, int16, uint16:
		return leafBound(numberBound(sp), !strings.ContainsRune(intVerbs, sp.verb), sp)
	case map[string]any:
		n := containerBound
		for k, e := range v {
			n += separatorBound + stringBound(len(k), sp) + valueBound(e, sp, limit-n, depth+1)
			if n > limit {
				return n
			}
		}
		return n
	case []any:
		n := containerBound
		for _, e := range v {
			n += separatorBound + valueBound(e, sp, limit-n, depth+1)
			if n > limit {
				return n
			}
		}
		return n
	}
	return reflectBound(reflect.ValueOf(v), sp, limit, depth)
}

// leafBound is a leaf of text bytes padded to sp's width, wrapped when the
// verb may not fit it. fmt counts the width in runes, so padding a
// multi-byte text adds up to width bytes to its length.
func leafBound(text int, wrapped bool, sp spec) int {
	n := text + sp.width
	if wrapped {
		n += wrapperBound
	}
	return n
}

// reflectBound is valueBound for types JSON does not produce. A value
// with methods fmt would call (String, Error, Format, GoString) could
// print anything: it counts as too large.
func reflectBound(v reflect.Value, sp spec, limit, depth int) int {
	if depth > maxValueDepth {
		return limit + 1
	}
	if !v.IsValid() {
		return leafBound(8, true, sp)
	}
	if v.CanInterface() {
		switch v.Interface().(type) {
		case fmt.Formatter, fmt.Stringer, fmt.GoStringer, error:
			return limit + 1
		}
	}
	leaf := func(n int) int { return leafBound(n, true, sp) }
	switch v.Kind() {
	case reflect.String:
		return stringBound(v.Len(), sp)
	case reflect.Bool, reflect.Chan, reflect.Func, reflect.UnsafePointer, reflect.Uintptr:
		return leaf(24)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return leaf(numberBound(sp))
	case reflect.Complex64, reflect.Complex128:
		return leaf(2*numberBound(sp) + 4 + sp.width)
	case reflect.Interface:
		if v.IsNil() {
			return leaf(8)
		}
		return reflectBound(v.Elem(), sp, limit, depth+1)
	case reflect.Pointer:
		if v.IsNil() || depth > 0 {
			return leaf(24) // an address
		}
		return 1 + reflectBound(v.Elem(), sp, limit, depth+1)
	case reflect.Slice, reflect.Array:
		n := containerBound
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			// []byte prints like a string with %s, %q, %x, and as numbers
			// (each with the precision's digits) with any other verb.
			return n + stringBound(v.Len(), sp) + v.Len()*leaf(numberBound(sp))
		}
		for i := range v.Len() {
			n += separatorBound + reflectBound(v.Index(i), sp, limit-n, depth+1)
			if n > limit {
				return n
			}
		}
		return n
	case reflect.Map:
		n := containerBound
		it := v.MapRange()
		for it.Next() {
			n += separatorBound + reflectBound(it.Key(), sp, limit-n, depth+1) + reflectBound(it.Value(), sp, limit-n, depth+1)
			if n > limit {
				return n
			}
		}
		return n
	case reflect.Struct:
		n := containerBound
		for i := range v.NumField() {
			n += separatorBound + len(v.Type().Field(i).Name) + reflectBound(v.Field(i), sp, limit-n, depth+1)
			if n > limit {
				return n
			}
		}
		return n
	}
	return limit + 1
}

// stringBound bounds a string of n bytes under sp, padded: %q escapes a
// byte into at most 4 ("\x00"), % #x writes "0x00 " for each, %T and %p
// write a type or a wrapped error, any other verb wraps the text.
func stringBound(n int, sp spec) int {
	switch sp.verb {
	case 's':
		return leafBound(n, false, sp)
	case 'v':
		if sp.sharp {
			return leafBound(4*n+2, false, sp)
		}
		return leafBound(n, false, sp)
	case 'q':
		return leafBound(4*n+2, false, sp)
	case 'x', 'X':
		return leafBound(5*n+2, false, sp)
	}
	return leafBound(n, true, sp)
}

// The verbs fmt formats numbers with; any other wraps the number in
// "%!s(float64=...)".
const (
	floatVerbs = "beEfFgGvxX"
	intVerbs   = "bcdoOqUvxX"
)

// numberBound bounds one number's text under sp: %f of 1e308 writes 309
// digits before the point and the precision after it, %b of an integer 64
// binary digits; every other verb fits in 32 bytes (-1.2345678901234567e+308,
// 'U+10FFFF', 0o1777777777777777777777) plus the precision's digits.
func numberBound(sp spec) int {
	switch sp.verb {
	case 'f', 'F':
		return 330 + sp.prec
	case 'b':
		return 72 + sp.prec
	}
	return 32 + sp.prec
}
