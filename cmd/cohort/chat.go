package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/ratelimit"
	"github.com/cohort-dev/cohort/internal/server"
)

// chatFlags registers serve's chat settings.
func chatFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.StringVar(&cfg.TurnRate, "turn-rate", env("COHORT_TURN_RATE", cfg.TurnRate), "chat turns per user or organization: N/s, N/m or N/h[,burst=B]; shared through --redis-url when set (COHORT_TURN_RATE)")
	fs.StringVar(&cfg.AgentCommand, "agent-command", env("COHORT_AGENT_COMMAND", cfg.AgentCommand), "with the local provisioner, the ACP agent each daemon runs, split on spaces; default: this executable with \"agent\" (COHORT_AGENT_COMMAND)")
}

// startChat gives chat its turn limiter: in memory, or in Redis so that
// every replica counts the same turns. The returned function releases it.
func startChat(ctx context.Context, srv *server.Server, cfg config.Config) (func(), error) {
	rate, err := ratelimit.ParseRate(cfg.TurnRate)
	if err != nil {
		return nil, fmt.Errorf("--turn-rate: %w", err)
	}
	if cfg.RedisURL == "" {
		l, err := ratelimit.NewMemory(rate, nil)
		if err != nil {
			return nil, err
		}
		srv.Chat.Limiter = l
		return func() {}, nil
	}
	rdb, err := ratelimit.OpenRedis(ctx, cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	l, err := ratelimit.NewRedis(rdb, "cohort:turn:", rate)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	srv.Chat.Limiter = l
	return func() { rdb.Close() }, nil
}
