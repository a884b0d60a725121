package main

import (
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/cohort-dev/cohort/internal/config"
)

// backgroundFlags registers serve's settings of background runs.
func backgroundFlags(fs *flag.FlagSet, cfg *config.Config) func() error {
	running := fs.String("background-max-running", env("COHORT_BACKGROUND_MAX_RUNNING", strconv.Itoa(cfg.BackgroundMaxRunning)), "running background runs one workspace may have; past it a background request is 429 (COHORT_BACKGROUND_MAX_RUNNING)")
	bytes := fs.String("background-event-bytes", env("COHORT_BACKGROUND_EVENT_BYTES", strconv.FormatInt(cfg.BackgroundEventBytes, 10)), "bytes of chunks kept per background run; past it only the chunks that end a response are kept (COHORT_BACKGROUND_EVENT_BYTES)")
	retention := fs.String("background-retention", env("COHORT_BACKGROUND_RETENTION", cfg.BackgroundRetention.String()), "how long an ended background run and its chunks are kept (COHORT_BACKGROUND_RETENTION)")
	lease := fs.String("background-lease", env("COHORT_BACKGROUND_LEASE", cfg.BackgroundLease.String()), "how long a gateway's claim to record a background run lasts unrenewed: the longest a run waits to be taken over after its gateway was killed (COHORT_BACKGROUND_LEASE)")
	return func() error {
		n, err := strconv.Atoi(*running)
		if err != nil || n <= 0 {
			return fmt.Errorf("--background-max-running (COHORT_BACKGROUND_MAX_RUNNING): %q is not a positive number", *running)
		}
		b, err := strconv.ParseInt(*bytes, 10, 64)
		if err != nil || b <= 0 {
			return fmt.Errorf("--background-event-bytes (COHORT_BACKGROUND_EVENT_BYTES): %q is not a positive number", *bytes)
		}
		r, err := time.ParseDuration(*retention)
		if err != nil || r <= 0 {
			return fmt.Errorf("--background-retention (COHORT_BACKGROUND_RETENTION): %q is not a positive duration such as 168h", *retention)
		}
		l, err := time.ParseDuration(*lease)
		if err != nil || l < time.Second {
			return fmt.Errorf("--background-lease (COHORT_BACKGROUND_LEASE): %q is not a duration of 1s or more", *lease)
		}
		cfg.BackgroundMaxRunning, cfg.BackgroundEventBytes, cfg.BackgroundRetention, cfg.BackgroundLease = n, b, r, l
		return nil
	}
}
