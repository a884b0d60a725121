package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
)

// backgroundMetrics are the background runs' and webhook deliveries'
// families (docs/operations.md, "Runs and webhooks"): counters fed by the
// hooks below on the replica that did the work, and gauges read from the
// database on each scrape, so every replica reports the same truth.
type backgroundMetrics struct {
	runsStarted    prometheus.Counter
	runsEnded      *prometheus.CounterVec
	runDuration    *prometheus.HistogramVec
	runEvents      prometheus.Counter
	runTruncations prometheus.Counter

	attempts       *prometheus.CounterVec
	attemptLatency prometheus.Histogram
}

func newBackgroundMetrics(reg *prometheus.Registry, db *bun.DB) backgroundMetrics {
	b := backgroundMetrics{
		runsStarted: prometheus.NewCounter(prometheus.CounterOpts{Name: "cohort_background_runs_started_total",
			Help: "Background runs started (a continued run is not a new one)."}),
		runsEnded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_background_runs_ended_total",
			Help: "Background runs ended, by status: completed, failed, cancelled."}, []string{"status"}),
		runDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cohort_background_run_duration_seconds",
			Help: "From a background run's start to its end (pauses included), by status.", Buckets: prometheus.ExponentialBuckets(0.1, 4, 10)},
			[]string{"status"}),
		runEvents: prometheus.NewCounter(prometheus.CounterOpts{Name: "cohort_background_run_events_total",
			Help: "Chunks stored for background runs (their event streams)."}),
		runTruncations: prometheus.NewCounter(prometheus.CounterOpts{Name: "cohort_background_run_truncations_total",
			Help: "Chunks not stored because their run reached its event bytes cap."}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_webhook_attempts_total",
			Help: "Webhook delivery attempts by outcome: succeeded, retry (failed, another attempt scheduled), failed (the last attempt failed)."}, []string{"outcome"}),
		attemptLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cohort_webhook_attempt_seconds",
			Help: "How long a webhook delivery attempt took (connection to response headers).", Buckets: prometheus.ExponentialBuckets(0.005, 3, 10)}),
	}
	reg.MustRegister(b.runsStarted, b.runsEnded, b.runDuration, b.runEvents, b.runTruncations, b.attempts, b.attemptLatency)
	if db != nil {
		reg.MustRegister(backgroundState{db: db,
			runs:   prometheus.NewDesc("cohort_background_runs", "Background runs that have not ended, by status (running, paused).", []string{"status"}, nil),
			queue:  prometheus.NewDesc("cohort_webhook_deliveries_pending", "Webhook deliveries waiting for an attempt or a retry.", nil, nil),
			oldest: prometheus.NewDesc("cohort_webhook_oldest_pending_seconds", "Age of the oldest pending webhook delivery (0 when none).", nil, nil),
		})
	}
	return b
}

// RunStarted, RunEnded and RunEvents implement runs.Observer.
func (m *Metrics) RunStarted() { m.bg.runsStarted.Inc() }
func (m *Metrics) RunEnded(status string, took time.Duration) {
	m.bg.runsEnded.WithLabelValues(status).Inc()
	m.bg.runDuration.WithLabelValues(status).Observe(took.Seconds())
}
func (m *Metrics) RunEvents(stored, dropped int) {
	m.bg.runEvents.Add(float64(stored))
	m.bg.runTruncations.Add(float64(dropped))
}

// WebhookAttempt counts one delivery attempt (webhooks.Worker.Observe).
func (m *Metrics) WebhookAttempt(outcome string, took time.Duration) {
	switch outcome {
	case "succeeded", "retry", "failed":
	default:
		outcome = "other"
	}
	m.bg.attempts.WithLabelValues(outcome).Inc()
	m.bg.attemptLatency.Observe(took.Seconds())
}

// backgroundState reads the runs not ended and the webhook queue on each
// scrape.
type backgroundState struct {
	db                  *bun.DB
	runs, queue, oldest *prometheus.Desc
}

func (c backgroundState) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.runs
	ch <- c.queue
	ch <- c.oldest
}

func (c backgroundState) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rows []struct {
		Status string `bun:"status"`
		N      int    `bun:"n"`
	}
	err := c.db.NewSelect().Table("runs").ColumnExpr("status, count(*) AS n").Where("status IN ('running', 'paused')").
		Group("status").Scan(ctx, &rows)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.runs, err)
	} else {
		n := map[string]int{"running": 0, "paused": 0}
		for _, r := range rows {
			n[r.Status] = r.N
		}
		for s, v := range n {
			ch <- prometheus.MustNewConstMetric(c.runs, prometheus.GaugeValue, float64(v), s)
		}
	}
	pending := c.db.NewSelect().Model((*store.WebhookDelivery)(nil)).Where("status = ?", store.WebhookPending)
	n, err := pending.Count(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.queue, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(n))
	var oldest []store.WebhookDelivery
	if err := pending.Column("created_at").OrderExpr("created_at").Limit(1).Scan(ctx, &oldest); err != nil {
		ch <- prometheus.NewInvalidMetric(c.oldest, err)
		return
	}
	age := 0.0
	if len(oldest) > 0 {
		age = max(0, time.Since(oldest[0].CreatedAt).Seconds())
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
}
