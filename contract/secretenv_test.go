package contract

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSecretEnvPolicy: an account may name BROADCAST_SECRET_* or a name
// dispatch allows, never NATS_* or another well-known variable (not even
// through the allow-list); every service refuses the reserved ones when it
// decodes the account. Errors name secret_env and say what is allowed.
func TestSecretEnvPolicy(t *testing.T) {
	t.Parallel()
	allow := []string{"HOOK_A_SECRET"}
	for name, ok := range map[string]bool{
		"":                         true,
		"BROADCAST_SECRET_HOOK_A":  true,
		"HOOK_A_SECRET":            true,
		"HOOK_B_SECRET":            false,
		"NATS_PASSWORD":            false,
		"nats_password":            false,
		"NATS_CREDS":               false,
		"AWS_SECRET_ACCESS_KEY":    false,
		"PATH":                     false,
		"DISPATCH_SECRET_ENVS":     false,
		"BROADCAST_SECRET_":        true,
		"BROADCAST_SECRET_A B":     false,
		"1BROADCAST_SECRET_X":      false,
		"BROADCAST_SECRET_X=1":     false,
		"broadcast_secret_hook_a":  false,
		"BROADCAST_SECRET_TOKEN_2": true,
	} {
		err := CheckSecretEnv(name, allow)
		if ok {
			require.NoError(t, err, name)
			continue
		}
		require.Error(t, err, name)
		var fe *FieldError
		require.ErrorAs(t, err, &fe, name)
		require.Equal(t, "secret_env", fe.Field, name)
		require.Contains(t, err.Error(), "name a variable starting with BROADCAST_SECRET_, or one listed in dispatch's DISPATCH_SECRET_ENVS (NATS_* and other well-known variables are never allowed)", name)
	}
	require.EqualError(t, CheckSecretEnv("NATS_PASSWORD", []string{"NATS_PASSWORD"}),
		"secret_env: NATS_PASSWORD may not be read by accounts: name a variable starting with BROADCAST_SECRET_, or one listed in dispatch's DISPATCH_SECRET_ENVS (NATS_* and other well-known variables are never allowed)")
	require.ErrorContains(t, CheckSecretEnvAllowList([]string{"HOOK_A_SECRET", "NATS_PASSWORD"}), "NATS_PASSWORD is reserved")
	require.ErrorContains(t, CheckSecretEnvAllowList([]string{"A-B"}), `"A-B" is not an environment variable name`)
	require.NoError(t, CheckSecretEnvAllowList([]string{"HOOK_A_SECRET", "SHOP_TOKEN"}))

	_, err := DecodeAccount("wa", []byte(`{"channel":"whatsapp","secret_env":"NATS_PASSWORD","endpoint":"https://evil.example"}`))
	require.ErrorContains(t, err, "secret_env: NATS_PASSWORD may not be read by accounts")
	_, err = DecodeAccount("wa", []byte(`{"channel":"whatsapp","secret_env":"HOOK_A_SECRET"}`))
	require.NoError(t, err, "an unprefixed name is dispatch's to allow or refuse")
}
