package channels

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/mail"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/broadcastd/broadcast/contract"
)

// composeSender is a plain-text sender with the given from and subject.
func composeSender(t testing.TB, from, subject string) *smtpSender {
	t.Helper()
	js, err := json.Marshal(map[string]any{"channel": "smtp", "host": "h", "from": from, "subject": subject, "concurrency": 1})
	require.NoError(t, err)
	acct, err := contract.DecodeAccount("x", js)
	require.NoError(t, err)
	s, err := SMTP{}.NewSender(acct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.(io.Closer).Close() })
	return s.(*smtpSender)
}

var dateLine = regexp.MustCompile(`^Date: [^\r]*\r\n`)

// goMailEmail is m as go-mail builds it, the way compose does for the
// messages it does not write itself.
func goMailEmail(t testing.TB, s *smtpSender, m Message) *email {
	t.Helper()
	msg, id, err := s.build(m)
	require.NoError(t, err)
	e := &email{id: id}
	e.from, e.to, err = envelope(msg)
	require.NoError(t, err)
	e.data, err = chunk(msg)
	require.NoError(t, err)
	return e
}

// requireSameEmail checks compose's email against go-mail's, byte for
// byte but for the Date line (the clock moved between them).
func requireSameEmail(t testing.TB, s *smtpSender, m Message) {
	t.Helper()
	got, err := s.compose(m)
	require.NoError(t, err)
	want := goMailEmail(t, s, m)
	require.Equal(t, want.id, got.id)
	require.Equal(t, want.from, got.from)
	require.Equal(t, want.to, got.to)
	require.Regexp(t, dateLine, string(got.data))
	require.Equal(t, string(dateLine.ReplaceAll(want.data, nil)), string(dateLine.ReplaceAll(got.data, nil)))
}

// TestSMTPComposeMatchesGoMail: the plain-text messages written without
// go-mail are the bytes go-mail writes.
func TestSMTPComposeMatchesGoMail(t *testing.T) {
	t.Parallel()
	bodies := []string{
		"hi",
		"Hello Üser, this is = the benchmark message.",
		"line one\nline two\n",
		"crlf one\r\ncrlf two\r\n",
		"a lone\rcarriage return",
		"trailing space \nand tab\t\nend",
		".a leading dot\n.\n..",
		strings.Repeat("x", 75) + "\n" + strings.Repeat("y", 76) + "\n" + strings.Repeat("z", 200),
		strings.Repeat("é", 100),
		"\n\n\nblank lines\n\n",
		"ends without newline=",
		"emoji 🎉 and 中文 text",
	}
	senders := []*smtpSender{
		composeSender(t, "noreply@shop.example", "Your order"),
		composeSender(t, "Shop <noreply@shop.example>", "Hello Ünïcode"),
		composeSender(t, strings.Repeat("Long Name ", 9)+"<noreply@shop.example>", strings.Repeat("Hello world ", 12)),
		composeSender(t, "Shöp Ü <noreply@shop.example>", strings.Repeat("Héllo wörld ", 12)),
	}
	for i, s := range senders {
		require.NotNil(t, s.plainHeaders, "sender %d", i)
		for j, body := range bodies {
			requireSameEmail(t, s, Message{ID: fmt.Sprintf("01JCOMPOSE%d.%d", i, j), To: "user+tag@Example.ORG", Body: body})
		}
	}
	// Ids with characters a Message-ID cannot hold, and unusual addresses.
	requireSameEmail(t, senders[1], Message{ID: "t/1 x.0", To: "li@example.com", Body: "hi"})
	requireSameEmail(t, senders[1], Message{ID: "t1.0", To: "o'brien@example.com", Body: "hi"})
}

// TestSMTPComposeFallsBackToGoMail: HTML accounts and recipients with a
// display name are built by go-mail.
func TestSMTPComposeFallsBackToGoMail(t *testing.T) {
	t.Parallel()
	s := composeSender(t, "Shop <noreply@shop.example>", "Your order")
	m := Message{ID: "t1.0", To: "Li Lei <li@example.com>", Body: "hi"}
	requireSameEmail(t, s, m)
	got, err := s.compose(m)
	require.NoError(t, err)
	require.Contains(t, string(got.data), "To: \"Li Lei\" <li@example.com>\r\n")

	acct, err := contract.DecodeAccount("x", []byte(`{"channel":"smtp","host":"h","from":"a@b.c","html":true}`))
	require.NoError(t, err)
	hs, err := SMTP{}.NewSender(acct, nil)
	require.NoError(t, err)
	defer func() { _ = hs.(io.Closer).Close() }()
	require.Nil(t, hs.(*smtpSender).plainHeaders)
	e, err := hs.(*smtpSender).compose(Message{ID: "t1.0", To: "li@example.com", Body: "<p>hi</p>"})
	require.NoError(t, err)
	require.Contains(t, string(e.data), "multipart/alternative")

	_, err = s.compose(Message{ID: "t1.1", To: "not an address", Body: "hi"})
	require.ErrorContains(t, err, `recipient "not an address"`)
}

// FuzzSMTPCompose: for any body, subject, recipient and job id the
// plain-text writer and go-mail agree (or both refuse the recipient).
func FuzzSMTPCompose(f *testing.F) {
	f.Add("Hello = world\n", "Your order", "li@example.com", "01JTASK.0")
	f.Add(".\r\n\r\n.", "Héllo wörld", "o'brien+x@Sub.Example.ORG", "t/1 x.0")
	f.Add(strings.Repeat("ab ", 40)+"\t\n", strings.Repeat("x", 100), "Li Lei <li@example.com>", "t1.0")
	// go-mail folds a To of 69 characters or more (found by CI's fuzzing),
	// and a Message-ID of 61.
	f.Add("0", "0", strings.Repeat("0", 65)+"@0", "t1.0")
	f.Add("0", "0", "li@example.com", strings.Repeat("7", 50))
	f.Fuzz(func(t *testing.T, body, subject, to, id string) {
		if strings.ContainsAny(subject, "\r\n") || len(subject) > 300 || len(body) > 4096 {
			return // the account's subject is one line
		}
		s := composeSender(t, "Shop <noreply@shop.example>", subject)
		if s.plainHeaders == nil {
			t.Skip("go-mail could not write the headers")
		}
		m := Message{ID: id, To: to, Body: body}
		got, err := s.compose(m)
		if _, _, buildErr := s.build(m); buildErr != nil {
			require.Error(t, err, "go-mail refused %q: %v", to, buildErr)
			return
		}
		require.NoError(t, err)
		want := goMailEmail(t, s, m)
		require.Equal(t, want.to, got.to)
		require.Equal(t, want.id, got.id)
		require.True(t, bytes.Equal(dateLine.ReplaceAll(want.data, nil), dateLine.ReplaceAll(got.data, nil)),
			"body %q subject %q to %q id %q:\n%q\n%q", body, subject, to, id, want.data, got.data)
	})
}

// TestSMTPDotAtomAddress: the addresses compose takes without parsing
// are those net/mail parses to themselves, bare and unquoted.
func TestSMTPDotAtomAddress(t *testing.T) {
	t.Parallel()
	for _, a := range []string{"li@example.com", "o'brien+x@sub.Example.ORG", "a.b.c@d", "x!#$%&*/=?^_`{|}~-@e.f",
		".a@b", "a.@b", "a..b@c", "a@b..c", "a@.b", "@b", "a@", "a b@c", "Li <li@example.com>", `"a"@b`, "a@b@c",
		"a@[1.2.3.4]", "é@example.com", "a(c)@b", ""} {
		fast := dotAtomAddress(a)
		if !fast {
			continue
		}
		parsed, err := mail.ParseAddress(a)
		require.NoError(t, err, a)
		require.Equal(t, a, parsed.Address, a)
		require.Empty(t, parsed.Name, a)
		require.Equal(t, "<"+a+">", (&mail.Address{Address: a}).String(), a)
	}
	require.True(t, dotAtomAddress("o'brien+x@sub.Example.ORG"))
	require.False(t, dotAtomAddress("a..b@c"))
	require.False(t, dotAtomAddress("Li <li@example.com>"))
}
