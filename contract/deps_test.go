package contract

import (
	"os/exec"
	"strings"
	"testing"
)

// TestContractImportsNoRuntime checks the contract stands below everything:
// none of its dependencies is another package of this module.
func TestContractImportsNoRuntime(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/broadcastd/broadcast/"
	var runtime []string
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		if strings.HasPrefix(dep, module) && dep != module+"contract" {
			runtime = append(runtime, dep)
		}
	}
	if len(runtime) > 0 {
		t.Fatalf("package contract imports runtime packages: %v", runtime)
	}
	if len(deps) < 10 {
		t.Fatalf("go list -deps gave %d packages, expected the standard library's too: %q", len(deps), out)
	}
}
