package agents

// Gemini CLI (`gemini --experimental-acp`) calls the Gemini API at
// GOOGLE_GEMINI_BASE_URL with GEMINI_API_KEY; its settings (in the
// intern's home) switch off telemetry, usage statistics, update checks and
// its own sandbox (the jail is the sandbox).
func init() {
	register(Profile{
		Name: "gemini", Package: "@google/gemini-cli", Version: "0.61.0",
		Bin: "gemini", Args: []string{"--experimental-acp"},
		Protocol: "gemini", Provider: "https://generativelanguage.googleapis.com",
		Model: "gemini-2.5-pro", KeySecret: "gemini_api_key",
		Setup: func(s Setup) ([]string, map[string]string) {
			settings := `{
  "security": {"auth": {"selectedType": "gemini-api-key"}},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "general": {"disableAutoUpdate": true, "disableUpdateNag": true, "checkpointing": {"enabled": false}},
  "tools": {"sandbox": false},
  "ide": {"enabled": false}
}`
			return []string{
				"GOOGLE_GEMINI_BASE_URL=" + s.BaseURL, "GEMINI_API_KEY=" + s.Key, "GEMINI_MODEL=" + s.Model,
				"GEMINI_CLI_NO_RELAUNCH=true", "GEMINI_SANDBOX=false", "NO_BROWSER=1",
				// The intern's own work directory, in its jail: trusted, or
				// Gemini CLI starts no MCP server (the daemon's http_request).
				"GEMINI_CLI_TRUST_WORKSPACE=true",
			}, map[string]string{".gemini/settings.json": settings}
		},
	})
}
