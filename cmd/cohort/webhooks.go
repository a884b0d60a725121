package main

import (
	"flag"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/safehttp"
)

// webhookFlags registers serve's webhook settings; server.New applies them.
func webhookFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.Func("webhook-allow-hosts", "comma-separated hostnames, addresses and ranges (hooks.internal,10.0.0.0/8) of webhook receivers on private addresses that deliveries may reach (plain http only to these); loopback and link-local only by range, 169.254.169.254 never (COHORT_WEBHOOK_ALLOW_HOSTS)", func(v string) error {
		cfg.WebhookAllowHosts = splitList(v)
		_, err := safehttp.ParseAllowlist(cfg.WebhookAllowHosts)
		return err
	})
	cfg.WebhookAllowHosts = splitList(env("COHORT_WEBHOOK_ALLOW_HOSTS", ""))
	fs.DurationVar(&cfg.WebhookLease, "webhook-lease", envDuration("COHORT_WEBHOOK_LEASE", time.Minute), "how long a webhook delivery a replica claimed is its own before another replica (or this one restarted) sends it again; longer than the 15s attempt timeout (COHORT_WEBHOOK_LEASE)")
}
