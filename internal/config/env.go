package config

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Every flag has one variable, named from the flag alone (EnvName): its
// default is read from it, its usage names it, and errors about it name
// both (Setting). The helpers below declare flags that way, so that no
// variable is spelled by hand (ADR 0961).

// EnvName is the variable of a flag: COHORT_ and its name upper-cased, with
// underscores for dashes (intern-idle-timeout: COHORT_INTERN_IDLE_TIMEOUT).
func EnvName(flag string) string {
	return "COHORT_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// ListEnvName is the variable of a repeatable flag: the plural of its
// EnvName, its entries separated by ';' (agent: COHORT_AGENTS).
func ListEnvName(flag string) string { return EnvName(flag) + "S" }

// Setting names a flag and its variable in an error:
// "--turn-rate (COHORT_TURN_RATE)".
func Setting(flag string) string { return "--" + flag + " (" + EnvName(flag) + ")" }

// String declares a string flag whose default is its variable's value, or
// def, and whose usage ends naming the variable.
func String(fs *flag.FlagSet, name, def, usage string) *string {
	p := new(string)
	StringVar(fs, p, name, def, usage)
	return p
}

// StringVar is String into p.
func StringVar(fs *flag.FlagSet, p *string, name, def, usage string) {
	fs.StringVar(p, name, Env(EnvName(name), def), usage+" ("+EnvName(name)+")")
}

// BoolVar is StringVar for a boolean; an unparsable variable is def.
func BoolVar(fs *flag.FlagSet, p *bool, name string, def bool, usage string) {
	fs.BoolVar(p, name, EnvBool(EnvName(name), def), usage+" ("+EnvName(name)+")")
}

// DurationVar is StringVar for a duration; an unparsable variable is def.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	if v, ok := os.LookupEnv(EnvName(name)); ok {
		if d, err := time.ParseDuration(v); err == nil {
			def = d
		}
	}
	fs.DurationVar(p, name, def, usage+" ("+EnvName(name)+")")
}

// ListVar declares a comma-separated list flag into p (default: its
// variable, also comma-separated).
func ListVar(fs *flag.FlagSet, p *[]string, name, usage string) {
	*p = SplitList(Env(EnvName(name), ""))
	fs.Func(name, usage+" ("+EnvName(name)+")", func(v string) error {
		*p = SplitList(v)
		return nil
	})
}

// RepeatedVar declares a repeatable flag into p; its variable
// (ListEnvName) holds the entries separated by ';'.
func RepeatedVar(fs *flag.FlagSet, p *[]string, name, usage string) {
	*p = splitOn(Env(ListEnvName(name), ""), ";")
	fs.Func(name, usage+" (repeatable; "+ListEnvName(name)+", entries separated by ';')", func(v string) error {
		*p = append(*p, v)
		return nil
	})
}

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
func SplitList(s string) []string { return splitOn(s, ",") }

func splitOn(s, sep string) []string {
	var out []string
	for _, p := range strings.Split(s, sep) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// KEKPath is the key-encryption key's file.
func (s Store) KEKPath() string {
	if s.KEKFile != "" {
		return s.KEKFile
	}
	return filepath.Join(s.DataDir, "kek.json")
}

// SQLitePath is the embedded database's file when it is not in the data
// directory.
func (s Store) SQLitePath() string {
	if p, ok := strings.CutPrefix(s.DatabaseURL, "sqlite:"); ok {
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
