package agents

import "strings"

// passNames are the variables of a daemon's environment that reach its
// agent, by exact name: where the agent lives (PATH, HOME, user, shell,
// temporary directory), how it speaks (locale, time zone, terminal), and
// how it reaches the network (proxies and CA bundles). None is meant to
// hold a secret. COHORT_CPUPROFILE is a file prefix for profiling.
var passNames = map[string]bool{
	"PATH": true, "HOME": true, "USER": true, "LOGNAME": true, "SHELL": true, "TMPDIR": true,
	"LANG": true, "LANGUAGE": true, "TZ": true, "TERM": true,
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "NO_PROXY": true, "ALL_PROXY": true,
	"http_proxy": true, "https_proxy": true, "no_proxy": true, "all_proxy": true,
	"SSL_CERT_FILE": true, "SSL_CERT_DIR": true, "NODE_EXTRA_CA_CERTS": true,
	"CURL_CA_BUNDLE": true, "GIT_SSL_CAINFO": true, "REQUESTS_CA_BUNDLE": true, "NPM_CONFIG_CAFILE": true,
	"COHORT_CPUPROFILE": true,
}

// passPrefixes are the families that pass: the locale's categories, the
// built-in agent's settings (its flags' COHORT_AGENT_* twins), and the
// tracing settings it exports its spans with (OTEL_*, in a jail the trace
// relay's address), except the exporter's headers (OTEL_*_HEADERS), which
// may hold a collector's credentials: a jail's relay adds them.
var passPrefixes = []string{"LC_", "COHORT_AGENT_", "OTEL_"}

// Environ is what of a daemon's environment reaches its agent: an
// allowlist (passNames, passPrefixes), the same for every daemon, jailed,
// unjailed, remote or in a pod, so that whatever else the host or the
// operator's shell holds (AWS_SECRET_ACCESS_KEY, a GITHUB_TOKEN, Cohort's
// own COHORT_* settings) never reaches an agent or the commands it runs.
// A catalog agent's own settings (Profile.Install) are added to it by the
// daemon. OPENAI_API_KEY and OPENAI_BASE_URL, which the built-in agent
// reads when its COHORT_AGENT_* twins are unset, pass under those twins'
// names, where only the built-in agent looks.
func Environ(env []string) []string {
	out := env[:0:0]
	have := map[string]bool{}
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if Passes(name) {
			out = append(out, kv)
			have[name] = true
		}
	}
	for _, kv := range env {
		name, val, _ := strings.Cut(kv, "=")
		if twin, ok := openAITwins[name]; ok && !have[twin] && val != "" {
			out = append(out, twin+"="+val)
			have[twin] = true
		}
	}
	return out
}

var openAITwins = map[string]string{"OPENAI_API_KEY": "COHORT_AGENT_API_KEY", "OPENAI_BASE_URL": "COHORT_AGENT_BASE_URL"}

// Passes reports whether the variable called name reaches an agent.
func Passes(name string) bool {
	if passNames[name] {
		return true
	}
	if strings.HasPrefix(name, "OTEL_") && strings.HasSuffix(name, "_HEADERS") {
		return false
	}
	for _, p := range passPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}
