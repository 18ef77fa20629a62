package channels

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/broadcastd/broadcast/contract"
)

// What every adapter shares, so that an adapter's file holds only its
// provider's protocol: reading its account (decodeOptions, secret,
// baseURL, requestTimeout), connecting (NetPolicy, newHTTPClient) and
// writing Result.Err (clip, redact, RedactURL, networkResult, redirected).
// Result.Err ends up in events, logs, the ledger and DEAD, so it is
// bounded and never carries a secret.

// Reading the account.

// decodeOptions reads an adapter's own fields out of the account JSON,
// naming the field when one has the wrong type.
func decodeOptions(acct *contract.Account, v any) error {
	if len(acct.Raw) == 0 {
		return nil
	}
	err := json.Unmarshal(acct.Raw, v)
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return &contract.FieldError{Field: typeErr.Field, Reason: fmt.Sprintf("must be %s, not JSON %s", typeErr.Type, typeErr.Value)}
	}
	return &contract.FieldError{Field: "account", Reason: err.Error()}
}

// secret reads the account's secret_env through getenv. A required secret
// must be named and non-empty.
func secret(acct *contract.Account, getenv func(string) string, required bool) (string, error) {
	if acct.SecretEnv == "" {
		if required {
			return "", errors.New("secret_env: required, the environment variable holding the token")
		}
		return "", nil
	}
	v := getenv(acct.SecretEnv)
	if v == "" {
		return "", fmt.Errorf("secret_env: environment variable %s is empty or unset", acct.SecretEnv)
	}
	return v, nil
}

// baseURL validates the account's endpoint (or def) as an http(s) base URL
// and returns it without a trailing slash. A channel whose requests carry a
// token (tokenBearing) needs https, except to a loopback host (tests, a
// local relay). Errors show the URL without its query (RedactURL).
func baseURL(endpoint, def string, tokenBearing bool) (string, error) {
	if endpoint == "" {
		endpoint = def
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("endpoint: %q is not an http(s) URL", RedactURL(endpoint))
	}
	if tokenBearing && u.Scheme != "https" && !IsLoopbackHost(u.Hostname()) {
		return "", fmt.Errorf("endpoint: %q must use https: this channel sends its token with every request (plain http is allowed only to localhost, 127.0.0.0/8 and ::1)", RedactURL(endpoint))
	}
	return strings.TrimRight(endpoint, "/"), nil
}

// IsLoopbackHost reports whether host (a name or an IP, as in a URL) is
// localhost or a loopback address. The name is not resolved.
func IsLoopbackHost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.Unmap().IsLoopback()
}

// requestTimeout is an account's "timeout" field, or def when it is unset.
func requestTimeout(d contract.Duration, def time.Duration) time.Duration {
	if d.D() > 0 {
		return d.D()
	}
	return def
}

// Connecting.

// NetPolicy says where an adapter may connect. Dispatch builds its channels
// with BuiltinWith(policy) from its configuration (DISPATCH_DENY_PRIVATE,
// DISPATCH_ALLOW_LOOPBACK); the zero value allows every destination.
type NetPolicy struct {
	// DenyPrivate refuses connections to private (10/8, 172.16/12,
	// 192.168/16, fc00::/7), link-local (169.254/16, where cloud metadata
	// services live, and fe80::/10), shared (100.64/10), unspecified,
	// multicast and loopback addresses. It is checked on the address being
	// dialled, after name resolution, so a name that resolves (or rebinds)
	// to such an address is refused too. With it, HTTP_PROXY and friends
	// are not used: the check must see the destination, not a proxy.
	DenyPrivate bool
	// AllowLoopback lets DenyPrivate still reach 127.0.0.0/8 and ::1
	// (a gateway on the same host, tests).
	AllowLoopback bool
}

// ErrDeniedAddress is wrapped by the error of a connection NetPolicy
// refused.
var ErrDeniedAddress = errors.New("destination address denied")

// sharedAddressSpace is RFC 6598's carrier-grade NAT range.
var sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10")

// refusal says why p refuses ip, or "" when it does not.
func (p NetPolicy) refusal(ip netip.Addr) string {
	if !p.DenyPrivate {
		return ""
	}
	ip = ip.Unmap()
	switch {
	case ip.IsLoopback():
		if p.AllowLoopback {
			return ""
		}
		return "loopback"
	case ip.IsPrivate():
		return "private"
	case ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast():
		return "link-local"
	case ip.IsUnspecified():
		return "unspecified"
	case ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return "multicast"
	case sharedAddressSpace.Contains(ip):
		return "shared (carrier-grade NAT)"
	case ip.Is4() && (ip.As4()[0] == 0 || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255})):
		return "reserved"
	}
	return ""
}

// control is a net.Dialer Control function: it runs for every address a
// dial tries, after resolution.
func (p NetPolicy) control(_, address string, _ syscall.RawConn) error {
	if !p.DenyPrivate {
		return nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		host = address
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("%w: %q is not an IP address", ErrDeniedAddress, host)
	}
	if why := p.refusal(ip); why != "" {
		return fmt.Errorf("%w: %s is a %s address (DISPATCH_DENY_PRIVATE)", ErrDeniedAddress, ip, why)
	}
	return nil
}

// dialer is the net.Dialer every adapter connects with.
func (p NetPolicy) dialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second, Control: p.control}
}

// newHTTPClient is the one HTTP client construction of the adapters. It
// keeps enough idle connections for the account's concurrency, so steady
// sending reuses TLS sessions; connects under p; uses the environment's
// proxy unless p denies private addresses; and never follows a redirect:
// a 307 re-sends the body, tokens included, to wherever the answer points,
// so a 3xx comes back to the adapter as the answer (ClassifyHTTP: permanent).
func newHTTPClient(acct *contract.Account, timeout time.Duration, p NetPolicy) *http.Client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           p.dialer(30 * time.Second).DialContext,
		MaxIdleConnsPerHost:   acct.Concurrency + 1,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
	}
	if p.DenyPrivate {
		tr.Proxy = nil
	}
	return &http.Client{
		Timeout:       timeout,
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Writing Result.Err.

// maxErrLen bounds Result.Err so a provider's HTML error page does not end
// up in every event.
const maxErrLen = 300

// clip shortens s to maxErrLen bytes without splitting a character.
func clip(s string) string {
	if len(s) <= maxErrLen {
		return s
	}
	cut := maxErrLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// redact removes the secrets from provider text: some providers echo the
// request, and Result.Err ends up in events and logs.
func redact(s string, secrets ...string) string {
	for _, secret := range secrets {
		if secret != "" {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}

// RedactURL returns raw without what may hold a credential: the query
// (often "?token=..."), user information and fragment. Endpoints are
// configuration, but a query string may carry a token, and url.Error
// repeats the whole URL into results, events, logs and DEAD.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Keep what precedes any query or credential.
		if i := strings.IndexAny(raw, "?#@"); i >= 0 {
			raw = raw[:i]
		}
		return raw
	}
	u.User = nil
	u.Fragment, u.RawFragment = "", ""
	if u.ForceQuery = false; u.RawQuery != "" {
		u.RawQuery = "[redacted]"
	}
	out := u.String()
	return strings.Replace(out, "?%5Bredacted%5D", "?[redacted]", 1)
}

// errorText is err's message with the URL of a url.Error redacted.
func errorText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		cp := *ue
		cp.URL = RedactURL(ue.URL)
		return cp.Error()
	}
	return err.Error()
}

// queryValues are the values of raw's query long enough to be a credential:
// an answer that echoes the request URL must not carry them into results.
func queryValues(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	for _, vs := range u.Query() {
		for _, v := range vs {
			if len(v) >= 4 {
				out = append(out, v)
			}
		}
	}
	return out
}

// networkResult classifies a failed HTTP round trip: retryable, or account
// fatal when NetPolicy refused the destination (every request of the
// account would be). The text has the URL redacted and secrets removed.
func networkResult(err error, secrets ...string) Result {
	code := "network"
	class := contract.ClassRetryable
	switch {
	case errors.Is(err, ErrDeniedAddress):
		class, code = contract.ClassAccountFatal, "denied_address"
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		code = "timeout"
	}
	return Result{Class: class, Code: code, Err: clip(redact(errorText(err), secrets...))}
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// redirected describes a 3xx answer: redirects are not followed. The
// target's host is named, never its path or query.
func redirected(resp *http.Response) string {
	where := ""
	if loc, err := resp.Location(); err == nil {
		where = " to " + loc.Scheme + "://" + loc.Host
	}
	return fmt.Sprintf("HTTP %d: redirect%s not followed (requests carry credentials); point the account's endpoint at the final URL", resp.StatusCode, where)
}
