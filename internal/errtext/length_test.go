package errtext_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// maxMessage is the longest error or log message literal the library may
// have: what happened and what to change; the rest belongs in the docs,
// which a message links to.
const maxMessage = 200

// Every error and log message literal of the library's packages (not its
// tests, test rig or examples) is at most maxMessage characters.
func TestMessagesAreShort(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, "_") || strings.HasPrefix(name, ".") || name == "testdata" || name == "testing" || name == "tools") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 || !isMessageCall(call.Fun) {
				return true
			}
			msg, ok := literal(call.Args[0])
			if !ok {
				return true
			}
			checked++
			if len(msg) > maxMessage {
				t.Errorf("%s: a %d-character message, at most %d: %.80q...", fset.Position(call.Pos()), len(msg), maxMessage, msg)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d messages checked: the walk missed the library's packages", checked)
	}
}

// isMessageCall reports the calls whose first argument is an error or log
// message: fmt.Errorf, errors.New, and a logger's Error, Info, Debug and
// Trace.
func isMessageCall(fun ast.Expr) bool {
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "fmt" && sel.Sel.Name == "Errorf" || x.Name == "errors" && sel.Sel.Name == "New") {
		return true
	}
	switch sel.Sel.Name {
	case "Error", "Info", "Debug", "Trace":
		return true
	}
	return false
}

// literal is the text of a string literal, or of literals joined with +.
func literal(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		a, aok := literal(e.X)
		b, bok := literal(e.Y)
		if !aok && !bok {
			return "", false
		}
		return a + b, true
	case *ast.ParenExpr:
		return literal(e.X)
	case *ast.CallExpr: // fmt.Sprintf("...", ...) as a message
		if sel, ok := e.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Sprintf" && len(e.Args) > 0 {
			return literal(e.Args[0])
		}
	}
	return "", false
}
