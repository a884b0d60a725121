package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/safehttp"
	"github.com/cohort-dev/cohort/internal/server"
)

// federationFlags registers serve's workload identity settings.
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

// startFederation applies the settings to the federation service and
// starts its periodic work (signing key rotation, audit retention). The
// returned function stops it.
func startFederation(ctx context.Context, srv *server.Server, cfg config.Config) (func(), error) {
	rate, err := ratelimit.ParseRate(cfg.ExchangeRate)
	if err != nil {
		return nil, fmt.Errorf("--exchange-rate: %w", err)
	}
	roots, err := safehttp.ExtraRootsFromFile(cfg.ExtraCAFile)
	if err != nil {
		return nil, err
	}
	fed := &srv.Federation.Config
	fed.TokenIssuer = cfg.TokenIssuer
	allow, err := safehttp.ParseAllowlist(cfg.FederationAllowHosts)
	if err != nil {
		return nil, fmt.Errorf("--federation-allow-hosts (COHORT_FEDERATION_ALLOW_HOSTS): %w", err)
	}
	fed.HTTPClient = safehttp.New(safehttp.Options{ExtraRoots: roots, Allow: allow})
	var closeRedis func() error
	if cfg.RedisURL != "" {
		rdb, err := ratelimit.OpenRedis(ctx, cfg.RedisURL)
		if err != nil {
			return nil, err
		}
		closeRedis = rdb.Close
		if fed.Limiter, err = ratelimit.NewRedis(rdb, "cohort:exchange:", rate); err != nil {
			rdb.Close()
			return nil, err
		}
	} else if fed.Limiter, err = ratelimit.NewMemory(rate, nil); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	go srv.Federation.Run(rctx)
	return func() {
		cancel()
		srv.Federation.Close()
		if closeRedis != nil {
			closeRedis()
		}
	}, nil
}
