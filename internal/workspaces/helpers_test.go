package workspaces_test

import "github.com/cohort-dev/cohort/internal/auth"

func opRoot() *auth.Principal         { return auth.Operator("") }
func opOf(org string) *auth.Principal { return auth.Operator(org) }
