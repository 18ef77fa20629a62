package contract

import (
	"fmt"
	"slices"
	"strings"
)

// SecretEnvPrefix begins the names of the environment variables an
// account's secret_env may name without further configuration. Dispatch
// may allow other names (DISPATCH_SECRET_ENVS), never a reserved one.
//
// An account is written by whoever may write broadcast_accounts, and
// dispatch sends the variable it names to the account's endpoint: an
// account naming NATS_PASSWORD once made dispatch hand its own NATS
// password to an endpoint of the writer's choosing.
const SecretEnvPrefix = "BROADCAST_SECRET_"

// reservedEnvPrefixes and reservedEnvNames are variables no account may
// read, whatever the allow-list says: the services' own credentials and
// settings, and the well-known variables of the system, the Go runtime,
// proxies, clouds and CI.
var (
	reservedEnvPrefixes = []string{
		"NATS_", "DISPATCH_", "INGEST_", "RENDER_", "STATUS_", "FEEDBACK_", "ALERT_", "DASHBOARD_",
		"METRICS_", "LOG_", "AWS_", "AZURE_", "GOOGLE_", "GCP_", "GCLOUD_", "KUBERNETES_", "DOCKER_",
		"SSH_", "GITHUB_", "GITLAB_", "CI_", "LD_", "DYLD_", "XDG_", "SUDO_", "SYSTEMD_",
	}
	reservedEnvNames = []string{
		"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "HOSTNAME", "TERM", "LANG", "TMPDIR",
		"TZ", "MAIL", "GOMEMLIMIT", "GOGC", "GOMAXPROCS", "GODEBUG", "GOFLAGS", "GOPATH", "GOROOT",
		"GOCACHE", "GOPROXY", "GOPRIVATE", "GONOSUMDB", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
		"ALL_PROXY", "DATABASE_URL", "REDIS_URL",
	}
)

// secretEnvAllowed says what secret_env may name, for error messages.
const secretEnvAllowed = "name a variable starting with " + SecretEnvPrefix + ", or one listed in dispatch's DISPATCH_SECRET_ENVS (NATS_* and other well-known variables are never allowed)"

// ReservedEnv reports whether name is a variable no account may read (the
// comparison ignores case).
func ReservedEnv(name string) bool {
	up := strings.ToUpper(name)
	if slices.Contains(reservedEnvNames, up) {
		return true
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(up, p) {
			return true
		}
	}
	return false
}

// validEnvName reports whether name is a portable environment variable
// name: letters, digits and '_', not starting with a digit, at most 128.
func validEnvName(name string) bool {
	if name == "" || len(name) > 128 || (name[0] >= '0' && name[0] <= '9') {
		return false
	}
	for i := range len(name) {
		c := name[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// checkSecretEnvSyntax is what every service checks of an account's
// secret_env: a valid name, not a reserved one. An empty name is allowed
// (no secret).
func checkSecretEnvSyntax(name string) error {
	switch {
	case name == "":
		return nil
	case !validEnvName(name):
		return fieldErr("secret_env", "%q is not an environment variable name (letters, digits and _): %s", truncate(name, 80), secretEnvAllowed)
	case ReservedEnv(name):
		return fieldErr("secret_env", "%s may not be read by accounts: %s", name, secretEnvAllowed)
	}
	return nil
}

// CheckSecretEnv reports whether an account may name the environment
// variable name in secret_env: it must start with SecretEnvPrefix or be in
// allowed (dispatch's DISPATCH_SECRET_ENVS), and never be reserved. The
// error is a *FieldError naming secret_env and saying what is allowed.
func CheckSecretEnv(name string, allowed []string) error {
	if err := checkSecretEnvSyntax(name); err != nil || name == "" {
		return err
	}
	if strings.HasPrefix(name, SecretEnvPrefix) || slices.Contains(allowed, name) {
		return nil
	}
	return fieldErr("secret_env", "%s may not be read by accounts: %s", name, secretEnvAllowed)
}

// CheckSecretEnvAllowList validates an allow-list of extra secret_env
// names (DISPATCH_SECRET_ENVS): each a valid name, none reserved.
func CheckSecretEnvAllowList(names []string) error {
	for _, n := range names {
		if !validEnvName(n) {
			return fmt.Errorf("%q is not an environment variable name", n)
		}
		if ReservedEnv(n) {
			return fmt.Errorf("%s is reserved: NATS_* and other well-known variables may never be read by accounts", n)
		}
	}
	return nil
}
