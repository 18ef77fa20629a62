package natstest

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/broadcastd/broadcast"

// listedPackage is what `go list -json` says of a package, in part.
type listedPackage struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Deps       []string
}

// TestHarnessLayers keeps the test harnesses in their layers: natstest
// depends on nothing of Broadcast's but internal/embedded, so shared's and
// the services' own tests can use it, topologytest on no service, and no
// package under internal/ imports a service it does not start (whose New
// it never calls), so a harness that starts services sits above them,
// never below.
func TestHarnessLayers(t *testing.T) {
	t.Parallel()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	out, err := exec.Command(goTool, "list", "-json", module+"/internal/...").Output()
	require.NoError(t, err, "go list")
	var pkgs []listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p listedPackage
		require.NoError(t, dec.Decode(&p))
		pkgs = append(pkgs, p)
	}

	starts := map[string][]string{}
	for _, p := range pkgs {
		if p.ImportPath == module+"/internal/natstest" {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, module+"/") && d != module+"/internal/embedded" {
					t.Errorf("internal/natstest depends on %s: the server harness must stay below shared and the services", strings.TrimPrefix(d, module+"/"))
				}
			}
		}
		if p.ImportPath == module+"/internal/topologytest" {
			for _, d := range p.Deps {
				if strings.HasPrefix(d, module+"/services/") {
					t.Errorf("internal/topologytest depends on %s: the services' own tests use it", strings.TrimPrefix(d, module+"/"))
				}
			}
		}
		started := startedServices(t, p)
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/services/") {
				continue
			}
			if !started[imp] {
				t.Errorf("%s imports %s but never starts it (no %s.New call)",
					strings.TrimPrefix(p.ImportPath, module+"/"), strings.TrimPrefix(imp, module+"/"), path.Base(imp))
				continue
			}
			starts[p.ImportPath] = append(starts[p.ImportPath], path.Base(imp))
		}
	}
	// The check sees the harnesses that do start services.
	for _, harness := range []string{"internal/pipelinetest", "internal/scenario"} {
		got := starts[module+"/"+harness]
		sort.Strings(got)
		require.Equal(t, []string{"dispatch", "ingest", "render", "status"}, got, "services %s starts", harness)
	}
}

// startedServices returns the service packages p's non-test files call New
// of.
func startedServices(t *testing.T, p listedPackage) map[string]bool {
	t.Helper()
	started := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
		require.NoError(t, err)
		local := map[string]string{} // name in this file -> service import path
		for _, spec := range f.Imports {
			imp, err := strconv.Unquote(spec.Path.Value)
			require.NoError(t, err)
			if !strings.HasPrefix(imp, module+"/services/") {
				continue
			}
			n := path.Base(imp)
			if spec.Name != nil {
				n = spec.Name.Name
			}
			local[n] = imp
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "New" {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && local[x.Name] != "" {
				started[local[x.Name]] = true
			}
			return true
		})
	}
	return started
}
