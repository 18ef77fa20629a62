package channels

// WhatsApp channel: the WhatsApp Business Cloud API (Meta Graph API).
//
// Account (KV broadcast_accounts):
//
//	{"channel":"whatsapp","secret_env":"BROADCAST_SECRET_WA_SHOP",
//	 "phone_number_id":"106540352242922","api_version":"v21.0",
//	 "default_region":"CN","tier":"10k","daily_cap":10000,
//	 "rate_per_sec":20,"concurrency":8,"per_recipient_interval":"6s","max_batch":1,
//	 "template":{"name":"order_update","language":"en_US","body_params":["name","code"]}}
//
//   - phone_number_id (required): the sending number's id in WhatsApp Manager.
//   - endpoint: Graph base URL. Defaults to https://graph.facebook.com.
//   - api_version: Graph API version. Defaults to v21.0.
//   - default_region: ISO 3166 region (e.g. "CN") for numbers written without
//     "+". Defaults to none: such numbers are skipped as "not in E.164".
//   - tier: the number's messaging limit, "250", "1k", "2k", "10k", "100k"
//     or "unlimited" (business-initiated conversations with unique users per
//     rolling 24 h). Set daily_cap to WhatsAppTierCap(tier); when daily_cap
//     is 0, EffectiveDailyCap returns the tier's cap.
//   - template: send an approved template instead of free text. Outside the
//     24 h customer-service window Meta only delivers templates. body_params
//     names the recipient variables that fill the body's {{1}}, {{2}}, ...
//     in order; the rendered task text is then not sent.
//   - timeout: per request. Defaults to 10s.
//
// Environment: the variable named by secret_env holds a system-user access
// token with whatsapp_business_messaging permission; it is sent as
// "Authorization: Bearer <token>" and never appears in results or logs.
//
// Recipients are phone numbers, normalised to E.164 ("+8613800000001") with
// libphonenumber rules; invalid numbers are skipped with the reason.
// Bodies are limited to 4,096 characters (the Cloud API text limit).
//
// Errors (Graph answers {"error":{"message","type","code","error_subcode",
// "fbtrace_id"}}; the code decides, the HTTP status only when the code is
// unknown):
//   - rate limited, account slows down: 130429 throughput, 4 and 613 app
//     call rate, 80007 WABA rate limit, HTTP 429 (Retry-After honoured);
//     131048 spam-rate restriction with a 10 min Retry-After: Meta lifts it
//     as the number's quality recovers, so the account cools down instead of
//     being paused for a person to resume.
//   - recipient delay, account keeps its pace: 131056 pair rate (retry after
//     6s); 131049 per-user marketing limit (retry after 24 h, Meta's advice).
//   - account fatal, the account is paused: 190 and other token errors (10,
//     200-299), 131031 account locked, 131005 access denied, 131042 payment,
//     131045 certificate, 133010 number not registered, 368 policy block,
//     100 with subcode 33 (phone_number_id does not exist), and HTTP 401/403
//     with unknown codes. The error type is not used: Graph labels almost
//     every error "OAuthException", per-recipient ones included.
//   - retryable: 1, 2, 131000, 131016, 131057, 133004, HTTP 5xx, network
//     errors and timeouts.
//   - permanent: 100, 131021, 131026, 131047 (outside the 24 h window: use a
//     template), 131051, 132000-132016 template errors, and any other 4xx.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nyaruka/phonenumbers"

	"github.com/broadcastd/broadcast/contract"
)

// WhatsApp defaults and limits.
const (
	WhatsAppDefaultEndpoint = "https://graph.facebook.com"
	WhatsAppDefaultVersion  = "v21.0"
	// WhatsAppMaxBody is the Cloud API's limit on a text message body.
	WhatsAppMaxBody = 4096
)

// Waits the Cloud API asks for without saying so in a header.
const (
	whatsappPairRateWait  = 6 * time.Second  // 131056: ~1 message per 6 s per user
	whatsappSpamRateWait  = 10 * time.Minute // 131048
	whatsappMarketingWait = 24 * time.Hour   // 131049
)

// WhatsApp sends through the WhatsApp Business Cloud API.
type WhatsApp struct {
	// Net is where its requests may go. Defaults to anywhere.
	Net NetPolicy
}

// Name implements Channel.
func (WhatsApp) Name() string { return "whatsapp" }

// NormalizeRecipient returns the number in E.164. Numbers without a leading
// "+" need an account's default_region: see NormalizeRecipientFor.
func (WhatsApp) NormalizeRecipient(to string) (string, error) { return NormalizeE164(to, "") }

// NormalizeRecipientFor is NormalizeRecipient with the account's
// default_region applied, for callers that know the sending account.
func (WhatsApp) NormalizeRecipientFor(acct *contract.Account, to string) (string, error) {
	var o whatsappOptions
	if err := decodeOptions(acct, &o); err != nil {
		return "", err
	}
	return NormalizeE164(to, o.DefaultRegion)
}

// CheckBody enforces the Cloud API's text limit.
func (WhatsApp) CheckBody(body string) error {
	if strings.TrimSpace(body) == "" {
		return errors.New("must not be empty")
	}
	if n := utf8.RuneCountInString(body); n > WhatsAppMaxBody {
		return fmt.Errorf("is %d characters, WhatsApp's limit is %d", n, WhatsAppMaxBody)
	}
	return nil
}

// NormalizeE164 parses a phone number and formats it in E.164. region (an
// ISO 3166 code such as "CN") is used for numbers without a leading "+";
// when it is empty such numbers are rejected.
func NormalizeE164(to, region string) (string, error) {
	to = strings.TrimSpace(to)
	if to == "" {
		return "", errors.New("must not be empty")
	}
	region = strings.ToUpper(strings.TrimSpace(region))
	if !strings.HasPrefix(to, "+") && region == "" {
		return "", fmt.Errorf("%q is not in E.164 (+<country code><number>); set default_region", to)
	}
	num, err := phonenumbers.Parse(to, region)
	if err != nil {
		return "", fmt.Errorf("%q is not a phone number: %v", to, err)
	}
	if !phonenumbers.IsValidNumber(num) {
		return "", fmt.Errorf("%q is not a valid phone number", to)
	}
	return phonenumbers.Format(num, phonenumbers.E164), nil
}

// whatsappTiers maps the tier names accepted in the account's "tier" field
// onto unique users per rolling 24 h; 0 means no cap.
var whatsappTiers = map[string]int{
	"250": 250, "1k": 1_000, "2k": 2_000, "10k": 10_000, "100k": 100_000, "unlimited": 0,
}

// WhatsAppTierCap returns the daily cap of a WhatsApp messaging-limit tier:
// "250", "1k", "2k", "10k", "100k" or "unlimited" (0, no cap). Set the
// account's daily_cap to it.
func WhatsAppTierCap(tier string) (int, error) {
	c, ok := whatsappTiers[strings.ToLower(strings.TrimSpace(tier))]
	if !ok {
		return 0, fmt.Errorf("unknown WhatsApp tier %q (want 250, 1k, 2k, 10k, 100k or unlimited)", tier)
	}
	return c, nil
}

// WhatsAppTemplate is the account's "template" field.
type WhatsAppTemplate struct {
	// Name of the approved template.
	Name string `json:"name"`
	// Language code the template was approved in, e.g. "en_US".
	Language string `json:"language"`
	// BodyParams names the recipient variables filling {{1}}, {{2}}, ...
	BodyParams []string `json:"body_params"`
}

// whatsappOptions are the WhatsApp-specific account fields.
type whatsappOptions struct {
	PhoneNumberID string            `json:"phone_number_id"`
	APIVersion    string            `json:"api_version"`
	DefaultRegion string            `json:"default_region"`
	Tier          string            `json:"tier"`
	Template      *WhatsAppTemplate `json:"template"`
	Timeout       contract.Duration `json:"timeout"`
}

var (
	graphVersionPattern = regexp.MustCompile(`^v[0-9]+\.[0-9]+$`)
	digitsPattern       = regexp.MustCompile(`^[0-9]+$`)
)

// NewSender implements Channel.
func (w WhatsApp) NewSender(acct *contract.Account, getenv func(string) string) (Sender, error) {
	var o whatsappOptions
	if err := decodeOptions(acct, &o); err != nil {
		return nil, err
	}
	if !digitsPattern.MatchString(o.PhoneNumberID) {
		return nil, fmt.Errorf("phone_number_id: required, the numeric id of the sending number, got %q", o.PhoneNumberID)
	}
	if o.APIVersion == "" {
		o.APIVersion = WhatsAppDefaultVersion
	}
	if !graphVersionPattern.MatchString(o.APIVersion) {
		return nil, fmt.Errorf("api_version: want a Graph API version like %q, got %q", WhatsAppDefaultVersion, o.APIVersion)
	}
	if o.DefaultRegion != "" && !phonenumbers.GetSupportedRegions()[strings.ToUpper(o.DefaultRegion)] {
		return nil, fmt.Errorf("default_region: %q is not a region code like \"CN\" or \"US\"", o.DefaultRegion)
	}
	if o.Tier != "" {
		if _, err := WhatsAppTierCap(o.Tier); err != nil {
			return nil, fmt.Errorf("tier: %v", err)
		}
	}
	if t := o.Template; t != nil {
		if t.Name == "" || t.Language == "" {
			return nil, errors.New("template: name and language are required")
		}
		for i, p := range t.BodyParams {
			if p == "" {
				return nil, fmt.Errorf("template.body_params[%d]: must name a recipient variable", i)
			}
		}
	}
	base, err := baseURL(acct.Endpoint, WhatsAppDefaultEndpoint, true)
	if err != nil {
		return nil, err
	}
	token, err := secret(acct, getenv, true)
	if err != nil {
		return nil, err
	}
	timeout := requestTimeout(o.Timeout, 10*time.Second)
	return &whatsappSender{
		url:      base + "/" + o.APIVersion + "/" + o.PhoneNumberID + "/messages",
		token:    token,
		region:   o.DefaultRegion,
		template: o.Template,
		client:   newHTTPClient(acct, timeout, w.Net),
	}, nil
}

type whatsappSender struct {
	url      string
	token    string
	region   string
	template *WhatsAppTemplate
	client   *http.Client
}

// Send posts one Cloud API request per message (the API takes one
// recipient per call). After an answer that concerns the whole account
// (rate limited, account fatal) the remaining messages are not tried.
func (s *whatsappSender) Send(ctx context.Context, msgs []Message) []Result {
	out := make([]Result, len(msgs))
	for i, m := range msgs {
		out[i] = s.sendOne(ctx, m)
		if stopsAccount(out[i].Class) {
			for j := i + 1; j < len(msgs); j++ {
				out[j] = out[i]
				out[j].ProviderID = ""
			}
			break
		}
	}
	return out
}

// stopsAccount reports whether an outcome concerns every message of the
// account, so sending the rest of a batch would only repeat it.
func stopsAccount(c contract.ErrorClass) bool {
	return c == contract.ClassRateLimited || c == contract.ClassAccountFatal
}

// Graph request bodies.
type (
	waRequest struct {
		MessagingProduct string      `json:"messaging_product"`
		RecipientType    string      `json:"recipient_type"`
		To               string      `json:"to"`
		Type             string      `json:"type"`
		Text             *waText     `json:"text,omitempty"`
		Template         *waTemplate `json:"template,omitempty"`
	}
	waText struct {
		Body string `json:"body"`
	}
	waTemplate struct {
		Name       string        `json:"name"`
		Language   waLanguage    `json:"language"`
		Components []waComponent `json:"components,omitempty"`
	}
	waLanguage struct {
		Code string `json:"code"`
	}
	waComponent struct {
		Type       string        `json:"type"`
		Parameters []waParameter `json:"parameters"`
	}
	waParameter struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
)

// graphAnswer is a Graph API response: messages on success, error otherwise.
type graphAnswer struct {
	Messages []struct {
		ID string `json:"id"`
	} `json:"messages"`
	Error *struct {
		Message      string `json:"message"`
		Type         string `json:"type"`
		Code         int    `json:"code"`
		ErrorSubcode int    `json:"error_subcode"`
		FBTraceID    string `json:"fbtrace_id"`
		ErrorData    struct {
			Details string `json:"details"`
		} `json:"error_data"`
	} `json:"error"`
}

func (s *whatsappSender) request(m Message) (*waRequest, *Result) {
	to, err := NormalizeE164(m.To, s.region)
	if err != nil {
		return nil, &Result{Class: contract.ClassPermanent, Code: "recipient", Err: "recipient " + err.Error()}
	}
	req := &waRequest{MessagingProduct: "whatsapp", RecipientType: "individual", To: to}
	if s.template == nil {
		req.Type, req.Text = "text", &waText{Body: m.Body}
		return req, nil
	}
	req.Type = "template"
	req.Template = &waTemplate{Name: s.template.Name, Language: waLanguage{Code: s.template.Language}}
	if len(s.template.BodyParams) > 0 {
		body := waComponent{Type: "body"}
		for i, name := range s.template.BodyParams {
			v, ok := varText(m.Vars[name])
			if !ok {
				return nil, &Result{Class: contract.ClassPermanent, Code: "template_param",
					Err: fmt.Sprintf("template parameter %q (body_params[%d]) is missing or empty in the recipient's vars", name, i)}
			}
			body.Parameters = append(body.Parameters, waParameter{Type: "text", Text: v})
		}
		req.Template.Components = []waComponent{body}
	}
	return req, nil
}

func (s *whatsappSender) sendOne(ctx context.Context, m Message) Result {
	body, bad := s.request(m)
	if bad != nil {
		return *bad
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return Result{Class: contract.ClassPermanent, Code: "encode", Err: err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(payload))
	if err != nil {
		return Result{Class: contract.ClassPermanent, Code: "request", Err: clip(redact(errorText(err), s.token))}
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return networkResult(err, s.token)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return Result{Class: contract.ClassPermanent, Code: strconv.Itoa(resp.StatusCode), Err: "whatsapp: " + redirected(resp)}
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var ans graphAnswer
	parsed := json.Unmarshal(raw, &ans) == nil
	if resp.StatusCode >= 200 && resp.StatusCode < 300 && (!parsed || ans.Error == nil) {
		r := Result{Code: strconv.Itoa(resp.StatusCode)}
		if len(ans.Messages) > 0 {
			r.ProviderID = ans.Messages[0].ID
		}
		return r
	}
	var r Result
	if parsed && ans.Error != nil {
		e := ans.Error
		r.Class, r.RetryAfter = classifyGraph(resp.StatusCode, e.Code, e.ErrorSubcode)
		r.Code = strconv.Itoa(e.Code)
		msg := fmt.Sprintf("whatsapp error %d", e.Code)
		if e.ErrorSubcode != 0 {
			msg += fmt.Sprintf("/%d", e.ErrorSubcode)
		}
		msg += fmt.Sprintf(" (HTTP %d, %s): %s", resp.StatusCode, e.Type, e.Message)
		if e.ErrorData.Details != "" {
			msg += ": " + e.ErrorData.Details
		}
		if e.FBTraceID != "" {
			msg += " [fbtrace_id " + e.FBTraceID + "]"
		}
		r.Err = msg
	} else {
		r.Class, r.RetryAfter = classifyGraph(resp.StatusCode, 0, 0)
		r.Code = strconv.Itoa(resp.StatusCode)
		r.Err = fmt.Sprintf("whatsapp: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if d, ok := ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok && r.Class == contract.ClassRateLimited {
		r.RetryAfter = max(r.RetryAfter, d)
	}
	r.Err = clip(redact(r.Err, s.token))
	return r
}

// classifyGraph maps a Graph API error onto an error class (see the file
// comment). code is 0 when the answer carried no Graph error.
func classifyGraph(status, code, subcode int) (contract.ErrorClass, time.Duration) {
	switch {
	case code == 130429, code == 4, code == 613, code == 80007:
		return contract.ClassRateLimited, 0
	case code == 131048:
		return contract.ClassRateLimited, whatsappSpamRateWait
	case code == 131056:
		return contract.ClassRecipientDelay, whatsappPairRateWait
	case code == 131049:
		return contract.ClassRecipientDelay, whatsappMarketingWait
	case code == 190, code == 10, code >= 200 && code <= 299, code == 131031, code == 131005,
		code == 131042, code == 131045, code == 133010, code == 368, code == 100 && subcode == 33:
		return contract.ClassAccountFatal, 0
	case code == 1, code == 2, code == 131000, code == 131016, code == 131057, code == 133004:
		return contract.ClassRetryable, 0
	case code == 100, code == 131021, code == 131026, code == 131047, code == 131051,
		code >= 132000 && code <= 132016:
		return contract.ClassPermanent, 0
	}
	switch {
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return contract.ClassAccountFatal, 0
	case status >= 200 && status < 300:
		// A 2xx carrying an unknown error: treat it like a 400.
		return contract.ClassPermanent, 0
	}
	return ClassifyHTTP(status), 0
}

// varText renders a recipient variable as a template parameter; JSON
// numbers arrive as float64 and must not turn into "1e+06".
func varText(v any) (string, bool) {
	var s string
	switch x := v.(type) {
	case nil:
		return "", false
	case string:
		s = x
	case float64:
		s = strconv.FormatFloat(x, 'f', -1, 64)
	case json.Number:
		s = x.String()
	default:
		s = fmt.Sprint(x)
	}
	return s, strings.TrimSpace(s) != ""
}
