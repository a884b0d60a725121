package main

import (
	"flag"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// federationFlags registers serve's workload identity settings (and the
// Redis that shares rate limits); server.New applies them.
func federationFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.Func("federation-allow-hosts", "comma-separated hostnames, addresses and ranges (keycloak.internal,10.0.0.0/8) of identity providers on private addresses that discovery and JWKS fetches may reach over https; loopback and link-local only by range, 169.254.169.254 never (COHORT_FEDERATION_ALLOW_HOSTS)", func(v string) error {
		cfg.FederationAllowHosts = splitList(v)
		_, err := safehttp.ParseAllowlist(cfg.FederationAllowHosts)
		return err
	})
	cfg.FederationAllowHosts = splitList(env("COHORT_FEDERATION_ALLOW_HOSTS", ""))
	fs.StringVar(&cfg.RedisURL, "redis-url", env("COHORT_REDIS_URL", cfg.RedisURL), "redis://… to share rate limits between replicas; empty keeps them in memory (COHORT_REDIS_URL)")
	fs.StringVar(&cfg.ExtraCAFile, "extra-ca-file", env("COHORT_EXTRA_CA_FILE", cfg.ExtraCAFile), "PEM certificates trusted in addition to the system roots when fetching identity provider keys (COHORT_EXTRA_CA_FILE)")
	fs.StringVar(&cfg.TokenIssuer, "token-issuer", env("COHORT_TOKEN_ISSUER", cfg.TokenIssuer), "iss and aud of federation access tokens; set it to the public base URL (COHORT_TOKEN_ISSUER)")
	fs.StringVar(&cfg.ExchangeRate, "exchange-rate", env("COHORT_EXCHANGE_RATE", cfg.ExchangeRate), "token exchanges per source address: N/s, N/m or N/h[,burst=B] (COHORT_EXCHANGE_RATE)")
}
