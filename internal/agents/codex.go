package agents

import "fmt"

// Codex (codex-acp) calls the OpenAI Responses API through a model
// provider of its config.toml under CODEX_HOME (the intern's home: Codex
// refuses to place its helper binaries under a temporary directory). The
// jail is the sandbox, so Codex's own is off; commands it does not trust
// ask first, which the daemon answers for self-drive.
func init() {
	register(Profile{
		Name: "codex", Package: "@zed-industries/codex-acp", Version: "0.16.0",
		Bin: "codex-acp", Protocol: "openai-responses", Provider: "https://api.openai.com/v1",
		Model: "gpt-5.3-codex", KeySecret: "openai_api_key",
		Setup: func(s Setup) ([]string, map[string]string) {
			config := fmt.Sprintf(`model = %q
model_provider = "cohort"
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.cohort]
name = "Cohort"
base_url = %q
wire_api = "responses"
env_key = "COHORT_CODEX_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false
`, s.Model, s.BaseURL)
			return []string{"CODEX_HOME=" + s.Home + "/.codex", "COHORT_CODEX_API_KEY=" + s.Key, "NO_BROWSER=1"},
				map[string]string{".codex/config.toml": config}
		},
	})
}
