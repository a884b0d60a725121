// Package metrics is the gateway's Prometheus metrics, served on their own
// listener (serve --metrics-listen), never on the API port. Names start
// with cohort_; labels are bounded sets (routes, methods, statuses,
// outcomes, reasons, states), never ids, keys, subjects or claims.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/uptrace/bun"
)

// Metrics holds the gateway's collectors.
type Metrics struct {
	reg *prometheus.Registry

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec

	firstEvent prometheus.Histogram
	open       prometheus.Gauge
	refusals   *prometheus.CounterVec
	runs       *prometheus.CounterVec

	exchanges *prometheus.CounterVec
	vault     *prometheus.CounterVec

	wakes    *prometheus.CounterVec
	kube     *prometheus.CounterVec
	wakeTime prometheus.Histogram

	bg backgroundMetrics
}

// New registers the collectors; db, when set, is read on each scrape for
// the interns by state.
func New(db *bun.DB) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_http_requests_total",
		Help: "HTTP requests (REST and Connect) by route pattern, method and status."}, []string{"route", "method", "status"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cohort_http_request_duration_seconds",
		Help: "HTTP request duration by route pattern and method (a stream's whole life).", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)},
		[]string{"route", "method"})
	m.firstEvent = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cohort_chat_first_chunk_seconds",
		Help: "From a chat request to its first chunk (the intern's first event), wakes included.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})
	m.open = prometheus.NewGauge(prometheus.GaugeOpts{Name: "cohort_chat_open_streams", Help: "Chat streams being sent."})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_chat_refusals_total",
		Help: "Chat requests refused before the stream, by reason."}, []string{"reason"})
	m.runs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_chat_runs_total",
		Help: "Chat requests by how the run ended: stop, paused, ended, error (with the post-200 error's reason), refused (with the refusal's reason), first_event_timeout, event_timeout, turn_timeout, caller_gone."}, []string{"outcome", "reason"})
	m.exchanges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_federation_exchanges_total",
		Help: "Token exchanges by outcome and the check that refused them."}, []string{"outcome", "failed_check"})
	m.vault = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_vault_operations_total",
		Help: "Vault writes (stored) and release decisions (released, refused)."}, []string{"operation", "outcome"})
	m.wakes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_intern_wakes_total",
		Help: "Wakes of sleeping interns by result."}, []string{"result"})
	m.kube = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cohort_kube_api_requests_total",
		Help: "Requests to the Kubernetes API (--provisioner kubernetes) by verb, resource and status class."}, []string{"verb", "resource", "code"})
	m.wakeTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cohort_intern_wake_seconds",
		Help: "How long a wake took.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)})
	m.reg.MustRegister(m.requests, m.duration, m.firstEvent, m.open, m.refusals, m.runs, m.exchanges, m.vault, m.wakes, m.wakeTime, m.kube,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.bg = newBackgroundMetrics(m.reg, db)
	if db != nil {
		m.reg.MustRegister(internStates{db: db, desc: prometheus.NewDesc("cohort_interns",
			"Interns by state (live ones: deleted interns are not counted).", []string{"state"}, nil)})
	}
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Request counts one finished HTTP request (accesslog.Handler's observer).
// route is the mux pattern that served it ("" when none did: "unmatched").
func (m *Metrics) Request(route, method string, status int, took time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	switch method {
	case http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodHead, http.MethodOptions:
	default:
		method = "other"
	}
	m.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route, method).Observe(took.Seconds())
}

// Opened, Closed, Refused and Finished implement turn.Observer.
func (m *Metrics) Opened(firstEvent time.Duration) {
	m.firstEvent.Observe(firstEvent.Seconds())
	m.open.Inc()
}
func (m *Metrics) Closed()               { m.open.Dec() }
func (m *Metrics) Refused(reason string) { m.refusals.WithLabelValues(orNone(reason)).Inc() }
func (m *Metrics) Finished(outcome, reason string) {
	m.runs.WithLabelValues(outcome, orNone(reason)).Inc()
}

// Exchange counts a token exchange (federation.Service.OnExchange).
func (m *Metrics) Exchange(outcome, failedCheck string) {
	m.exchanges.WithLabelValues(outcome, orNone(failedCheck)).Inc()
}

// Vault counts a vault operation (vault.Service.Observe).
func (m *Metrics) Vault(operation, outcome string) { m.vault.WithLabelValues(operation, outcome).Inc() }

// Wake counts a wake (provision.Provisioner.OnWake).
func (m *Metrics) Wake(took time.Duration, ok bool) {
	result := "ok"
	if !ok {
		result = "failed"
	}
	m.wakes.WithLabelValues(result).Inc()
	m.wakeTime.Observe(took.Seconds())
}

// KubeCall counts a request to the Kubernetes API (provision.Provisioner.OnKubeCall).
func (m *Metrics) KubeCall(verb, resource string, code int) {
	class := "error"
	if code >= 100 && code < 600 {
		class = strconv.Itoa(code/100) + "xx"
	}
	switch resource {
	case "pods", "secrets", "persistentvolumeclaims", "leases":
	default:
		resource = "other"
	}
	switch verb {
	case "GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "DELETE":
	default:
		verb = "other"
	}
	m.kube.WithLabelValues(verb, resource, class).Inc()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// internStates reads the interns by state on each scrape.
type internStates struct {
	db   *bun.DB
	desc *prometheus.Desc
}

func (c internStates) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c internStates) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rows []struct {
		State string `bun:"state"`
		N     int    `bun:"n"`
	}
	if err := c.db.NewSelect().Table("interns").ColumnExpr("state, count(*) AS n").Where("state <> 'deleted'").
		Group("state").Scan(ctx, &rows); err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(r.N), r.State)
	}
}
