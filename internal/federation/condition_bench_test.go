package federation

import "testing"

// BenchmarkCondition measures one evaluation of a compiled condition that
// uses all four variables and a comprehension, the input built per call
// as an exchange does.
//
//	go test -run '^$' -bench BenchmarkCondition -count 10 ./internal/federation/
func BenchmarkCondition(b *testing.B) {
	cc, err := compileCondition(`subject.startsWith("repo:acme/") && "cohort" in audience && scopes.exists(s, s == "deploy") && token_type != "refresh"`)
	if err != nil {
		b.Fatal(err)
	}
	aud := []string{"cohort", "https://kubernetes.default.svc"}
	scopes := []string{"read", "write", "deploy"}
	b.ReportAllocs()
	for b.Loop() {
		ok, err := cc.eval(newConditionInput("repo:acme/app:ref:refs/heads/main", aud, scopes, "id"))
		if err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
