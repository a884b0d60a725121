package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
)

// chatFlags registers serve's chat settings.
func chatFlags(fs *flag.FlagSet, cfg *config.Config) func() error {
	fs.StringVar(&cfg.TurnRate, "turn-rate", env("COHORT_TURN_RATE", cfg.TurnRate), "chat turns per user or organization: N/s, N/m or N/h[,burst=B]; shared through --redis-url when set (COHORT_TURN_RATE)")
	fs.StringVar(&cfg.AgentCommand, "agent-command", env("COHORT_AGENT_COMMAND", cfg.AgentCommand), "with the local provisioner, the ACP agent each daemon runs, split on spaces; default: this executable with \"agent\" (COHORT_AGENT_COMMAND)")
	durations := []struct {
		name, variable, usage string
		dst                   *time.Duration
		raw                   *string
	}{
		{"chat-keepalive", "COHORT_CHAT_KEEPALIVE", "silence after which a chat stream or a background run's event stream sends a keepalive (': keepalive'; on Connect a keepalive message) (the spec's 30s)", &cfg.ChatKeepalive, nil},
		{"first-event-timeout", "COHORT_FIRST_EVENT_TIMEOUT", "request budget: how long a chat request waits for the agent's first event before 504 timeout", &cfg.FirstEventTimeout, nil},
		{"event-timeout", "COHORT_EVENT_TIMEOUT", "longest silence of an intern on an open chat stream before the stream ends with a timeout", &cfg.EventTimeout, nil},
		{"turn-timeout", "COHORT_TURN_TIMEOUT", "longest a chat request's run may take in all (time paused for an answer excluded) before it ends with a timeout and is cancelled", &cfg.TurnTimeout, nil},
		{"interaction-deadline", "COHORT_INTERACTION_DEADLINE", "with the local provisioner, how long a question waits for its answer before the run is cancelled", &cfg.InteractionDeadline, nil},
		// Not chat's, but validated the same way.
		{"shutdown-timeout", "COHORT_SHUTDOWN_TIMEOUT", "how long graceful shutdown waits for requests to finish", &cfg.ShutdownTimeout, nil},
	}
	for i := range durations {
		d := &durations[i]
		d.raw = fs.String(d.name, env(d.variable, d.dst.String()), d.usage+" ("+d.variable+")")
	}
	return func() error {
		for _, d := range durations {
			v, err := time.ParseDuration(*d.raw)
			if err != nil || v <= 0 {
				return fmt.Errorf("--%s (%s): %q is not a positive duration such as 30s or 5m", d.name, d.variable, *d.raw)
			}
			*d.dst = v
		}
		return nil
	}
}
