package config

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Env returns the value of a COHORT_* variable, or def.
func Env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// EnvBool is Env for a boolean; an unparsable value is def.
func EnvBool(name string, def bool) bool {
	if v, ok := os.LookupEnv(name); ok {
		b, err := strconv.ParseBool(v)
		if err == nil {
			return b
		}
	}
	return def
}

// EnvInt is Env for a whole number; an unparsable value is def.
func EnvInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// EnvDuration is Env for a duration (5m); an unparsable value is def.
func EnvDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

// SplitList splits a comma-separated flag value, dropping empty entries.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// KEKPath is the key-encryption key's file.
func (c Config) KEKPath() string {
	if c.KEKFile != "" {
		return c.KEKFile
	}
	return filepath.Join(c.DataDir, "kek.json")
}

// SQLitePath is the embedded database's file when it is not in the data
// directory.
func (c Config) SQLitePath() string {
	if p, ok := strings.CutPrefix(c.DatabaseURL, "sqlite:"); ok {
		return p
	}
	return ""
}

// AgentEnv is what of the gateway's environment reaches a daemon and its
// agent on the gateway's behalf: the built-in agent's settings, without
// the model endpoint and key, which a relay stands in for.
func AgentEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "COHORT_AGENT_") && name != "COHORT_AGENT_BASE_URL" && name != "COHORT_AGENT_API_KEY" {
			out = append(out, kv)
		}
	}
	return out
}
