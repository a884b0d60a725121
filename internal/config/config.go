// Package config is the typed configuration of `cohort serve`, with its
// defaults. cmd/cohort fills it from flags and COHORT_* variables.
package config

import "time"

// Config configures the gateway.
type Config struct {
	// Listen is the address for HTTP/1.1 and h2c.
	Listen string
	// DataDir holds the embedded database, key files and bootstrap.json.
	DataDir string
	// DatabaseURL selects PostgreSQL (postgres://…); empty means the
	// embedded SQLite file in DataDir.
	DatabaseURL string
	// KEKFile is the key-encryption key (a Tink keyset file). Empty means
	// <DataDir>/kek.json, created on first start.
	KEKFile string
	// NoBootstrap skips creating the default organization on an empty database.
	NoBootstrap bool
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// RegionalHosts are Host header values (regional API hostnames) on
	// which the vault refuses every request with 403.
	RegionalHosts []string
	// ShutdownTimeout bounds graceful shutdown.
	ShutdownTimeout time.Duration
	// Provisioner hosts interns: "local" (daemons started by the gateway)
	// or "remote" (daemons registered by the operator).
	Provisioner string

	// RedisURL (redis:// or rediss://), when set, keeps rate limits in
	// Redis so that replicas share them; empty keeps them in memory.
	RedisURL string
	// ExtraCAFile holds PEM certificates trusted, in addition to the
	// system roots, when fetching identity provider documents.
	ExtraCAFile string
	// TokenIssuer is the iss and aud of federation access tokens; set it
	// to the public base URL.
	TokenIssuer string
	// ExchangeRate is the per-address token exchange limit: "N/s", "N/m"
	// or "N/h", optionally ",burst=B".
	ExchangeRate string
}

// Default returns the defaults the README documents.
func Default() Config {
	return Config{
		Listen:          "127.0.0.1:8080",
		DataDir:         "./.cohort",
		LogLevel:        "info",
		ShutdownTimeout: 10 * time.Second,
		Provisioner:     "local",
		TokenIssuer:     "cohort",
		ExchangeRate:    "60/m",
	}
}
