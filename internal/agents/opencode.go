package agents

import "encoding/json"

// OpenCode (`opencode acp`) calls an OpenAI-compatible Chat Completions
// endpoint through its bundled provider. Its whole configuration goes in
// OPENCODE_CONFIG_CONTENT: one provider ("cohort") pointing at the
// endpoint, shell and edits asking first (the daemon answers for
// self-drive), and nothing that reaches the internet (models.dev, updates,
// sharing, LSP downloads).
func init() {
	register(Profile{
		Name: "opencode", Package: "opencode-ai", Version: "1.18.33",
		Bin: "opencode", Args: []string{"acp"},
		Protocol: "openai-chat", Provider: "https://api.openai.com/v1", Model: "gpt-5-mini",
		KeySecret: "openai_api_key",
		Setup: func(s Setup) ([]string, map[string]string) {
			config := map[string]any{
				"$schema":    "https://opencode.ai/config.json",
				"autoupdate": false,
				"share":      "disabled",
				"provider": map[string]any{"cohort": map[string]any{
					"npm": "@ai-sdk/openai-compatible", "name": "Cohort",
					"options": map[string]any{"baseURL": s.BaseURL, "apiKey": s.Key},
					"models":  map[string]any{s.Model: map[string]any{"name": s.Model, "tool_call": true}},
				}},
				"model":      "cohort/" + s.Model,
				"permission": map[string]any{"bash": "ask", "edit": "ask", "webfetch": "ask"},
			}
			b, _ := json.Marshal(config)
			return []string{
				"OPENCODE_CONFIG_CONTENT=" + string(b),
				"OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_SHARE=1",
				"OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_CLAUDE_CODE=1",
				"OPENCODE_DISABLE_EXTERNAL_SKILLS=1", "OPENCODE_DISABLE_PROJECT_CONFIG=1",
				"XDG_CONFIG_HOME=" + s.Home + "/.config", "XDG_DATA_HOME=" + s.Home + "/.local/share",
				"XDG_CACHE_HOME=" + s.Home + "/.cache", "XDG_STATE_HOME=" + s.Home + "/.local/state",
			}, nil
		},
	})
}
