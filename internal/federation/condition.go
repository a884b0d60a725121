package federation

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	celast "cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/env"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"

	"github.com/cohort-dev/cohort/internal/apierr"
)

// MaxCondition is the spec's bound on a CEL condition, in characters.
const MaxCondition = 2000

// conditionCostLimit bounds one evaluation. The inputs are bounded (16
// scopes, a token of at most 16 KB) and comprehensions cannot nest, so a
// valid condition stays far below it; the limit is the last line of
// defence, not a rule an admin meets.
const conditionCostLimit = 1_000_000

// The four variables a condition may use (spec: Condition variables).
const (
	varSubject   = "subject"
	varAudience  = "audience"
	varScopes    = "scopes"
	varTokenType = "token_type"
)

var (
	celEnvOnce sync.Once
	celEnv     *cel.Env
	celEnvErr  error
)

// conditionEnv is the one CEL environment: the standard library without
// matches() (a regular expression from an admin would be the only costly
// operation left), the four variables, and a validator that refuses
// comprehension macros nested in one another.
func conditionEnv() (*cel.Env, error) {
	celEnvOnce.Do(func() {
		subset := env.NewLibrarySubset().AddExcludedFunctions(env.NewFunction("matches"))
		celEnv, celEnvErr = cel.NewCustomEnv(
			cel.StdLib(cel.StdLibSubset(subset)),
			cel.Variable(varSubject, cel.StringType),
			cel.Variable(varAudience, cel.ListType(cel.StringType)),
			cel.Variable(varScopes, cel.ListType(cel.StringType)),
			cel.Variable(varTokenType, cel.StringType),
			cel.ASTValidators(cel.ValidateComprehensionNestingLimit(1)),
		)
	})
	return celEnv, celEnvErr
}

// compiledCondition is a checked, planned condition and the variables it
// reads (a wrongly typed claim fails the exchange only when the condition
// reads the variable it feeds).
type compiledCondition struct {
	prg  cel.Program
	uses map[string]bool
}

// conditionError is a save-time refusal: the message names the rule.
func conditionError(format string, args ...any) *apierr.Error {
	return apierr.BadRequest("condition: "+format, args...)
}

// CheckCondition applies the save-time rules to a condition; see
// compileCondition.
func CheckCondition(expr string) error {
	_, err := compileCondition(expr)
	return err
}

// compileCondition parses and type-checks expr with the save-time rules:
// at most 2,000 characters, only the four variables, no matches(), no
// nested comprehension macros, a boolean result. Each refusal is a 400
// whose message names the rule broken.
func compileCondition(expr string) (*compiledCondition, error) {
	if n := utf8.RuneCountInString(expr); n > MaxCondition {
		return nil, conditionError("must be at most %d characters, not %d", MaxCondition, n)
	}
	if !utf8.ValidString(expr) {
		return nil, conditionError("must be valid UTF-8")
	}
	if strings.TrimSpace(expr) == "" {
		return nil, conditionError("is empty")
	}
	e, err := conditionEnv()
	if err != nil {
		// The environment is a constant of this code: it builds, or
		// nothing compiles.
		return nil, apierr.Bug("the CEL environment does not build: %w", err)
	}
	parsed, iss := e.Parse(expr)
	if iss.Err() != nil {
		return nil, conditionError("syntax error: %s", firstIssue(iss.Err()))
	}
	// matches() is looked for in the parsed tree, before type checking,
	// so the refusal says so instead of "undeclared reference".
	if usesFunction(parsed.NativeRep().Expr(), "matches") {
		return nil, conditionError("matches() is not available in conditions (regular expressions are not allowed)")
	}
	checked, iss := e.Check(parsed)
	if iss.Err() != nil {
		msg := firstIssue(iss.Err())
		switch {
		case strings.Contains(msg, "comprehension exceeds nesting limit"):
			return nil, conditionError("comprehension macros (all, exists, exists_one, filter, map) cannot be nested in one another")
		case strings.Contains(msg, "undeclared reference"):
			return nil, conditionError("%s: only the variables subject, audience, scopes and token_type and the standard functions may be used", msg)
		default:
			return nil, conditionError("type error: %s", msg)
		}
	}
	if !checked.OutputType().IsExactType(types.BoolType) {
		return nil, conditionError("must yield a boolean, not %s", checked.OutputType())
	}
	prg, err := e.Program(checked,
		cel.EvalOptions(cel.OptOptimize),
		cel.CostLimit(conditionCostLimit),
		cel.InterruptCheckFrequency(100),
	)
	if err != nil {
		return nil, conditionError("cannot be planned: %v", err)
	}
	uses := map[string]bool{}
	for _, r := range checked.NativeRep().ReferenceMap() {
		if r.Name != "" {
			uses[r.Name] = true
		}
	}
	return &compiledCondition{prg: prg, uses: uses}, nil
}

// firstIssue keeps the first line of a CEL error: the message without the
// source excerpt and caret.
func firstIssue(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "ERROR: <input>:")
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	return strings.TrimSpace(msg)
}

// usesFunction reports whether the expression calls fn, as a function or
// as a method.
func usesFunction(e celast.Expr, fn string) bool {
	found := false
	visitor := celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() == celast.CallKind && e.AsCall().FunctionName() == fn {
			found = true
		}
	})
	celast.PostOrderVisit(e, visitor)
	return found
}

// conditionInput holds the four variables of one evaluation. It is the
// Activation itself, so an evaluation allocates no map.
type conditionInput struct {
	subject   ref.Val
	audience  ref.Val
	scopes    ref.Val
	tokenType ref.Val
}

func newConditionInput(subject string, audience, scopes []string, tokenType string) *conditionInput {
	return &conditionInput{
		subject:   types.String(subject),
		audience:  types.NewStringList(types.DefaultTypeAdapter, audience),
		scopes:    types.NewStringList(types.DefaultTypeAdapter, scopes),
		tokenType: types.String(tokenType),
	}
}

// ResolveName implements interpreter.Activation.
func (in *conditionInput) ResolveName(name string) (any, bool) {
	switch name {
	case varSubject:
		return in.subject, true
	case varAudience:
		return in.audience, true
	case varScopes:
		return in.scopes, true
	case varTokenType:
		return in.tokenType, true
	}
	return nil, false
}

// Parent implements interpreter.Activation.
func (in *conditionInput) Parent() interpreter.Activation { return nil }

var errNotBool = errors.New("condition did not yield a boolean")

// eval runs the condition. Only a boolean true passes.
func (c *compiledCondition) eval(in *conditionInput) (bool, error) {
	out, _, err := c.prg.Eval(in)
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("%w: %s", errNotBool, out.Type())
	}
	return bool(b), nil
}

// conditionCache keeps compiled conditions by their text: compiling costs
// far more than evaluating, and the text is what identifies the program.
type conditionCache struct {
	mu sync.Mutex
	m  map[string]*compiledCondition
}

// maxCachedConditions bounds the cache; when full it starts over (the
// working set is the organization's policies, far below this).
const maxCachedConditions = 4096

func (c *conditionCache) get(expr string) (*compiledCondition, error) {
	c.mu.Lock()
	cc, ok := c.m[expr]
	c.mu.Unlock()
	if ok {
		return cc, nil
	}
	cc, err := compileCondition(expr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedConditions {
		c.m = map[string]*compiledCondition{}
	}
	c.m[expr] = cc
	c.mu.Unlock()
	return cc, nil
}
