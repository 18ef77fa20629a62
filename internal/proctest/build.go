package proctest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Binaries are the executables a process test runs.
type Binaries struct {
	// Broadcast is the cmd/broadcast binary.
	Broadcast string
	// NATSServer is nats-server, built from the module's tool dependency so
	// it matches the version the in-process tests embed.
	NATSServer string
}

var (
	buildOnce sync.Once
	built     Binaries
	buildErr  error
)

// BuildBinaries builds broadcast and nats-server once per test binary run and
// returns their paths; every later call returns the same paths at once.
//
// The binaries go to a directory under os.TempDir() named after the module
// root (PROCTEST_BIN_DIR overrides it), so runs reuse one copy instead of
// leaving a new one behind each time. Each is linked to a staging file that
// nothing executes, so the Go build cache can skip relinking when nothing
// changed, then copied under a temporary name and renamed into place only
// when its content changed: a process still running the previous binary is
// never disturbed. A file lock serialises test binaries of several packages
// building at once.
func BuildBinaries(t testing.TB) Binaries {
	t.Helper()
	buildOnce.Do(func() { built, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("proctest: %v", buildErr)
	}
	return built
}

func build() (Binaries, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	root, err := moduleRoot(goBin)
	if err != nil {
		return Binaries{}, err
	}
	dir := os.Getenv("PROCTEST_BIN_DIR")
	if dir == "" {
		sum := sha256.Sum256([]byte(root))
		dir = filepath.Join(os.TempDir(), "broadcast-proctest-"+hex.EncodeToString(sum[:6]))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("binary dir: %w", err)
	}
	unlock, err := lockFile(filepath.Join(dir, ".lock"))
	if err != nil {
		return Binaries{}, fmt.Errorf("lock binary dir: %w", err)
	}
	defer unlock()
	b := Binaries{
		Broadcast:  filepath.Join(dir, "broadcast"),
		NATSServer: filepath.Join(dir, "nats-server"),
	}
	for _, target := range []struct{ out, pkg string }{
		{b.Broadcast, "./cmd/broadcast"},
		{b.NATSServer, "github.com/nats-io/nats-server/v2"},
	} {
		if err := goBuild(goBin, root, target.out, target.pkg); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// goBuild builds pkg into out.build and installs that as out when out
// differs, through a temporary copy and a rename.
func goBuild(goBin, root, out, pkg string) error {
	start := time.Now()
	staged := out + ".build"
	cmd := exec.Command(goBin, "build", "-buildvcs=false", "-o", staged, pkg)
	cmd.Dir = root
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s: %v\n%s", pkg, err, output.String())
	}
	fresh, err := os.ReadFile(staged)
	if err != nil {
		return err
	}
	if current, err := os.ReadFile(out); err == nil && bytes.Equal(current, fresh) {
		return nil
	}
	tmp := fmt.Sprintf("%s.tmp-%d", out, os.Getpid())
	if err := os.WriteFile(tmp, fresh, 0o755); err != nil {
		return fmt.Errorf("install %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("install %s: %w", out, err)
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "proctest: built %s in %s\n", filepath.Base(out), time.Since(start).Round(10*time.Millisecond))
	}
	return nil
}

// moduleRoot is the directory of the main module's go.mod, found from the
// test's working directory (its package directory).
func moduleRoot(goBin string) (string, error) {
	out, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside a Go module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}
