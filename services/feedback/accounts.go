package feedback

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/broadcastd/broadcast/contract"
	"github.com/broadcastd/broadcast/shared"
)

// accounts is what feedback needs of KV broadcast_accounts: which account
// a WhatsApp phone_number_id belongs to, and the secrets that sign each
// provider's posts (read from the environment variables the accounts
// name, never stored).
type accounts struct {
	aw     *shared.AccountWatcher
	getenv func(string) string
	allow  []string

	mu       sync.RWMutex
	phones   map[string]string // phone_number_id -> account name
	names    map[string]string // account name -> phone_number_id
	displays map[string]string // digits of display_phone_number -> account name
	display  map[string]string // account name -> those digits
}

// whatsappFields are the account fields of a WhatsApp account feedback reads.
type whatsappFields struct {
	PhoneNumberID string `json:"phone_number_id"`
	// DisplayPhoneNumber is the number as account webhooks name it.
	DisplayPhoneNumber string `json:"display_phone_number"`
	AppSecretEnv       string `json:"app_secret_env"`
	VerifyTokenEnv     string `json:"verify_token_env"`
}

func newAccounts(getenv func(string) string, allow []string) *accounts {
	return &accounts{getenv: getenv, allow: allow, phones: map[string]string{}, names: map[string]string{},
		displays: map[string]string{}, display: map[string]string{}}
}

// change keeps the phone number map current; it is the account
// watcher's callback.
func (a *accounts) change(c shared.AccountChange) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.names[c.Name]; ok {
		if a.phones[old] == c.Name {
			delete(a.phones, old)
		}
		delete(a.names, c.Name)
	}
	if old, ok := a.display[c.Name]; ok {
		if a.displays[old] == c.Name {
			delete(a.displays, old)
		}
		delete(a.display, c.Name)
	}
	if c.Account == nil || c.Account.Channel != "whatsapp" {
		return
	}
	var f whatsappFields
	if json.Unmarshal(c.Account.Raw, &f) != nil || f.PhoneNumberID == "" {
		return
	}
	a.phones[f.PhoneNumberID] = c.Name
	a.names[c.Name] = f.PhoneNumberID
	if d := digits(f.DisplayPhoneNumber); d != "" {
		a.displays[d] = c.Name
		a.display[c.Name] = d
	}
}

// byDisplayPhone returns the WhatsApp account whose display_phone_number
// has these digits, or nil.
func (a *accounts) byDisplayPhone(digits string) *contract.Account {
	a.mu.RLock()
	name, ok := a.displays[digits]
	a.mu.RUnlock()
	if !ok {
		return nil
	}
	return a.aw.Get(name)
}

// byPhone returns the WhatsApp account of phone_number_id, or nil.
func (a *accounts) byPhone(phoneNumberID string) *contract.Account {
	a.mu.RLock()
	name, ok := a.phones[phoneNumberID]
	a.mu.RUnlock()
	if !ok {
		return nil
	}
	return a.aw.Get(name)
}

// whatsappAccounts returns every WhatsApp account with a phone number id.
func (a *accounts) whatsappAccounts() []*contract.Account {
	a.mu.RLock()
	names := make([]string, 0, len(a.names))
	for n := range a.names {
		names = append(names, n)
	}
	a.mu.RUnlock()
	out := make([]*contract.Account, 0, len(names))
	for _, n := range names {
		if acct := a.aw.Get(n); acct != nil {
			out = append(out, acct)
		}
	}
	return out
}

// channel returns the channel of the named account, "" when unknown.
func (a *accounts) channel(name string) string {
	if acct := a.aw.Get(name); acct != nil {
		return acct.Channel
	}
	return ""
}

// errNoSecret says an account names no usable secret: its posts cannot be
// checked, so they are refused.
var errNoSecret = errors.New("no secret configured")

// secret reads the variable an account's field names, checked like
// dispatch checks secret_env.
func (a *accounts) secret(field, name string) ([]byte, error) {
	if name == "" {
		return nil, fmt.Errorf("%s: %w", field, errNoSecret)
	}
	if err := contract.CheckSecretEnv(name, a.allow); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	v := a.getenv(name)
	if v == "" {
		return nil, fmt.Errorf("%s: environment variable %s is empty or unset: %w", field, name, errNoSecret)
	}
	return []byte(v), nil
}

// whatsappSecrets returns an account's app secret and verify token (either
// nil when not configured).
func (a *accounts) whatsappSecrets(acct *contract.Account) (appSecret, verifyToken []byte) {
	var f whatsappFields
	if json.Unmarshal(acct.Raw, &f) != nil {
		return nil, nil
	}
	appSecret, _ = a.secret("app_secret_env", f.AppSecretEnv)
	verifyToken, _ = a.secret("verify_token_env", f.VerifyTokenEnv)
	return appSecret, verifyToken
}
