package agents

// Claude (claude-agent-acp, which runs Claude Code through its SDK) calls
// the Anthropic Messages API at ANTHROPIC_BASE_URL with ANTHROPIC_API_KEY.
// Its state lives under CLAUDE_CONFIG_DIR in the intern's home; telemetry,
// error reports, the updater and other non-essential traffic are off (the
// jail would refuse them anyway, slowly).
func init() {
	register(Profile{
		Name: "claude", Package: "@agentclientprotocol/claude-agent-acp", Version: "0.101.0",
		Bin: "claude-agent-acp", Protocol: "anthropic", Provider: "https://api.anthropic.com",
		Model: "claude-sonnet-4-5", KeySecret: "anthropic_api_key",
		Setup: func(s Setup) ([]string, map[string]string) {
			return []string{
				"ANTHROPIC_BASE_URL=" + s.BaseURL, "ANTHROPIC_API_KEY=" + s.Key, "ANTHROPIC_MODEL=" + s.Model,
				"ANTHROPIC_SMALL_FAST_MODEL=" + s.Model,
				"CLAUDE_CONFIG_DIR=" + s.Home + "/.claude",
				"DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_AUTOUPDATER=1", "DISABLE_BUG_COMMAND=1",
				"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_NON_ESSENTIAL_MODEL_CALLS=1",
				"CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY=1", "NO_BROWSER=1",
			}, nil
		},
	})
}
