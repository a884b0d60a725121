package kubepods

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/egress"
	"github.com/cohort-dev/cohort/internal/provision"
)

func init() { provision.Register(kind{}) }

type kind struct{}

func (kind) Name() string  { return Name }
func (kind) Usage() string { return "each awake intern is a Pod" }

// Flags are the settings of --provisioner kubernetes (docs/kubernetes.md).
func (kind) Flags(fs *flag.FlagSet) provision.Setup {
	return &setup{
		config:        config.String(fs, "kube-config", "", "with kubernetes, the kubeconfig file of the cluster; empty: the Pod's own service account"),
		namespace:     config.String(fs, "kube-namespace", "cohort-interns", "with kubernetes, the namespace of intern Pods, claims, Secrets and Leases"),
		image:         config.String(fs, "kube-image", "", "with kubernetes, the image intern Pods run (/cohort intern): the gateway's own; required"),
		gatewayURL:    config.String(fs, "kube-gateway-url", "", "with kubernetes, where intern Pods reach the gateway (http://cohort.cohort.svc.cluster.local:8080); required"),
		cpuRequest:    config.String(fs, "kube-cpu-request", "100m", "with kubernetes, each intern Pod's CPU request"),
		memoryRequest: config.String(fs, "kube-memory-request", "128Mi", "with kubernetes, each intern Pod's memory request"),
		cpuLimit:      config.String(fs, "kube-cpu-limit", "1", "with kubernetes, each intern Pod's CPU limit"),
		memoryLimit:   config.String(fs, "kube-memory-limit", "1Gi", "with kubernetes, each intern Pod's memory limit"),
		storage:       config.String(fs, "kube-storage-size", "1Gi", "with kubernetes, the size of each intern's claim, which outlives its Pods"),
		tmpSize:       config.String(fs, "kube-tmp-size", "1Gi", "with kubernetes, the size limit of each intern Pod's /tmp (its HOME), an emptyDir; past it the Pod is evicted"),
		storageClass:  config.String(fs, "kube-storage-class", "", "with kubernetes, the storage class of the claims; empty: the cluster's default"),
		wakeTimeout:   config.String(fs, "kube-wake-timeout", "2m", "with kubernetes, how long a wake waits for the intern's Pod to be ready"),
		runtimeClass:  config.String(fs, "kube-runtime-class", "", "with kubernetes, the RuntimeClass of intern Pods (gvisor: GKE Sandbox, most gVisor installs); set it in the admission policy's ConfigMap too, which then admits no other"),
		agentModules:  config.String(fs, "kube-agent-modules", "", "with kubernetes, the known third-party agents' node_modules directory in the image; empty: they do not run in Pods"),
	}
}

// setup holds the flags until Check turns them into the cluster's Config.
type setup struct {
	config, namespace, image, gatewayURL                      *string
	cpuRequest, memoryRequest, cpuLimit, memoryLimit, storage *string
	storageClass, wakeTimeout, agentModules, tmpSize          *string
	runtimeClass                                              *string

	kc     *Config
	relay  *egress.Relay
	onCall func(verb, resource string, code int)
	b      *Backend
}

// Check checks the flags and loads the cluster's client settings (a file
// read, nothing written or dialled).
func (s *setup) Check(config.Config) error {
	if *s.image == "" {
		return fmt.Errorf("%s is required with --provisioner kubernetes", config.Setting("kube-image"))
	}
	if !strings.HasPrefix(*s.gatewayURL, "http://") && !strings.HasPrefix(*s.gatewayURL, "https://") {
		return fmt.Errorf("%s must be the http:// or https:// URL intern Pods reach the gateway at, not %q", config.Setting("kube-gateway-url"), *s.gatewayURL)
	}
	kc := &Config{Namespace: *s.namespace, Image: *s.image, StorageClass: *s.storageClass, AgentModules: *s.agentModules, RuntimeClass: *s.runtimeClass,
		Identity: os.Getenv("POD_NAME"), Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	for _, q := range []struct {
		flag, v string
		into    corev1.ResourceList
		name    corev1.ResourceName
	}{
		{"kube-cpu-request", *s.cpuRequest, kc.Requests, corev1.ResourceCPU},
		{"kube-memory-request", *s.memoryRequest, kc.Requests, corev1.ResourceMemory},
		{"kube-cpu-limit", *s.cpuLimit, kc.Limits, corev1.ResourceCPU},
		{"kube-memory-limit", *s.memoryLimit, kc.Limits, corev1.ResourceMemory},
		{"kube-storage-size", *s.storage, nil, corev1.ResourceStorage},
		{"kube-tmp-size", *s.tmpSize, nil, corev1.ResourceEphemeralStorage},
	} {
		if q.v == "" && q.into != nil {
			continue // no request or limit of that kind
		}
		v, err := resource.ParseQuantity(q.v)
		if err != nil || v.Sign() <= 0 {
			return fmt.Errorf("%s: %q is not a quantity such as 500m, 256Mi or 2", config.Setting(q.flag), q.v)
		}
		switch {
		case q.name == corev1.ResourceEphemeralStorage:
			kc.TmpSize = v
		case q.into == nil:
			kc.StorageSize = v
		default:
			q.into[q.name] = v
		}
	}
	d, err := time.ParseDuration(*s.wakeTimeout)
	if err != nil || d <= 0 {
		return fmt.Errorf("%s: %q is not a duration such as 2m", config.Setting("kube-wake-timeout"), *s.wakeTimeout)
	}
	kc.WakeTimeout = d
	var rc *rest.Config
	if *s.config != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", *s.config)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", config.Setting("kube-config"), err)
	}
	rc.UserAgent = "cohort-gateway"
	// client-go's default of 5 requests a second would pace wakes, not the cluster.
	rc.QPS, rc.Burst = 50, 100
	kc.REST = rc
	s.kc = kc
	return nil
}

// Prepare makes the model relay of intern Pods, served on the gateway's
// own listener (RelayPath): the operator's model endpoint and key
// (COHORT_AGENT_BASE_URL and COHORT_AGENT_API_KEY, as for jails), and each
// third-party agent's endpoint with its key from the intern's vault.
func (s *setup) Prepare(_ context.Context, env provision.Env) (func(), error) {
	if s.kc == nil {
		return nil, errors.New("kubernetes: settings not checked")
	}
	cfg := env.Config
	root := strings.TrimRight(*s.gatewayURL, "/")
	s.kc.GatewayURL, s.kc.RelayURL = root+env.APIPrefix, root+RelayPath
	relay, err := egress.New(egress.Config{ModelBaseURL: cfg.Agents.BaseURL, ModelAPIKey: cfg.Agents.APIKey,
		Placeholder: agents.KeyPlaceholder, Log: env.Log.With("component", "egress")})
	if err != nil {
		return nil, fmt.Errorf("model endpoint (COHORT_AGENT_BASE_URL): %w", err)
	}
	s.relay = relay
	s.kc.ModelPath, s.kc.AgentEnv = relay.ModelPath(), cfg.Agents.Env
	if cfg.Agents.APIKey != "" {
		s.kc.ModelKeyPlaceholder = agents.KeyPlaceholder
	}
	return func() { relay.Close() }, nil
}

func (s *setup) Backend(env provision.Env, p *provision.Provisioner, ag provision.Agents) (provision.Backend, error) {
	if s.relay == nil {
		return nil, errors.New("server: the kubernetes provisioner needs its cluster (its setup's Check and Prepare)")
	}
	s.b = &Backend{Config: *s.kc, Agents: ag, InteractionDeadline: env.Config.Chat.InteractionDeadline, OnCall: s.onCall}
	s.b.relayHandler = s.b.PodModelRelay(p, s.relay)
	return s.b, nil
}

// Routes serves the Pods' model relay beside the API.
func (s *setup) Routes(api http.Handler) http.Handler {
	if s.b == nil {
		return api
	}
	mux := http.NewServeMux()
	mux.Handle(RelayPath, s.b.relayHandler)
	mux.Handle("/", api)
	return mux
}

func (s *setup) Serve(http.Handler)        {}
func (s *setup) Observe(h provision.Hooks) { s.onCall = h.KubeCall }
func (s *setup) Warnings() []string        { return nil }
func (s *setup) Unsafe() string            { return "" }

// WakeTimeout: a wake may wait for another replica's Lease to expire.
func (s *setup) WakeTimeout() time.Duration {
	if s.kc == nil || s.kc.WakeTimeout <= 0 {
		return 0
	}
	return s.kc.WakeTimeout + max(s.kc.LeaseDuration, 15*time.Second)
}
