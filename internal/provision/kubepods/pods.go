package kubepods

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cohort-dev/cohort/internal/internd/launch"
	"github.com/cohort-dev/cohort/internal/provision"
)

// The Kubernetes fleet. Each awake intern is one Pod in the interns'
// namespace, its state on a PersistentVolumeClaim that outlives the Pod:
// sleep deletes the Pod and keeps the claim, wake creates the Pod again,
// delete removes both. Pods are not the gateway's children, so they
// outlive a gateway restart and any replica can reach any of them.
//
// Every replica runs the reconciler; a Lease per intern makes exactly one
// of them act on it at a time. A replica that dies mid-action stops
// renewing its Lease, and once it expires the next replica's pass picks
// the intern up where the objects say it was: the daemon secret is in the
// intern's row (wrapped by the KEK) before its Pod exists, so whoever acts
// next can give the Pod its Secret.

// Name is this backend's, as rows record it.
const Name = "kubernetes"

// DaemonPort is where an intern's daemon listens in its Pod.
const DaemonPort = 7100

// Labels and annotations of an intern's objects.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	LabelIntern    = "cohort.dev/intern"
	// annSecret holds a digest of the wrapped daemon secret the Pod was
	// made for: a Pod whose row has another secret is stale.
	annSecret = "cohort.dev/daemon-secret-digest"
	annModel  = "cohort.dev/model"
	annAgent  = "cohort.dev/agent"
)

// podDataDir is the intern's directory in its Pod (the claim).
const podDataDir = "/var/lib/cohort/intern"

// podUID is the non-root user of intern Pods (distroless "nonroot").
const podUID = 65532

// Config is what the Kubernetes backend needs of the operator.
type Config struct {
	// REST reaches the cluster (a kubeconfig's or the Pod's own).
	REST *rest.Config
	// Namespace holds the interns' Pods, claims, Secrets and Leases.
	Namespace string
	// Image runs `/cohort intern` (the gateway's own image).
	Image string
	// GatewayURL is where Pods reach the gateway's API (with its prefix).
	GatewayURL string
	// Requests and Limits are each Pod's resources.
	Requests, Limits corev1.ResourceList
	// StorageSize and StorageClass describe each intern's claim ("" is the
	// cluster's default class).
	StorageSize  resource.Quantity
	StorageClass string
	// TmpSize caps each Pod's /tmp, an emptyDir (default 1 Gi): past it
	// the kubelet evicts the Pod instead of filling the node's disk.
	TmpSize resource.Quantity
	// WakeTimeout bounds the wait for a Pod to become ready (default 2 m).
	WakeTimeout time.Duration
	// Identity names this replica in Leases (default: host name and pid).
	Identity string
	// LeaseDuration is how long a replica that stopped renewing keeps an
	// intern (default 15 s).
	LeaseDuration time.Duration
	// RelayURL is where Pods reach the gateway's model relay (the
	// gateway's root and RelayPath); ModelPath the operator's model
	// endpoint's path; ModelKeyPlaceholder the key agents hold when the
	// gateway has one; AgentEnv the built-in agent's other settings.
	RelayURL, ModelPath, ModelKeyPlaceholder string
	AgentEnv                                 []string
	// AgentModules is the known third-party agents' node_modules in the
	// image ("": they do not run in Pods).
	AgentModules string
	// RuntimeClass, when set, is the RuntimeClass of every intern Pod
	// (gvisor: GKE Sandbox, a gVisor install); the admission policy then
	// admits no other (deploy/gateway-admission.yaml, ADR 0982).
	RuntimeClass string
}

// Object names of an intern (its id is a UUID: a valid DNS label).
func podName(id string) string   { return "intern-" + id }
func claimName(id string) string { return "intern-" + id }
func leaseName(id string) string { return "intern-" + id }

// secretName is the Secret of the Pod made for the wrapped daemon secret
// whose digest is given: each Pod has one of its own, so the gateway
// never reads a Secret to learn whose it is (its account may not:
// docs/kubernetes.md).
func secretName(id, digest string) string { return "intern-" + id + "-" + digest }

// podSecret is the Secret pod's daemon takes its secret from ("": none).
func podSecret(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == "COHORT_INTERN_SECRET" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return e.ValueFrom.SecretKeyRef.Name
			}
		}
	}
	return ""
}

// Backend runs each awake intern as a Pod of the interns' namespace.
type Backend struct {
	Config
	// Agents is what an intern's agent name runs.
	Agents provision.Agents
	// InteractionDeadline, when set, is passed to daemons as
	// --interaction-deadline.
	InteractionDeadline time.Duration
	// OnCall, when set before the gateway starts, is told of every
	// request to the Kubernetes API (internal/metrics).
	OnCall func(verb, resource string, code int)

	log          *slog.Logger
	relayHandler http.Handler
	api          *kubeAPI
	informers    []cache.SharedIndexInformer
	pods         corelisters.PodLister
	claims       corelisters.PersistentVolumeClaimLister
}

var _ provision.Backend = (*Backend)(nil)

func (*Backend) Name() string { return Name }

// Open connects to the cluster and runs the informers of the interns'
// Pods and claims until ctx ends; every change asks for a pass.
func (b *Backend) Open(ctx context.Context, h provision.Host) error {
	b.log = h.Log
	c := &b.Config
	if c.WakeTimeout <= 0 {
		c.WakeTimeout = 2 * time.Minute
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		c.Identity = host + "-" + strconv.Itoa(os.Getpid()) + "-" + provision.NewSecret()[:6]
	}
	if c.StorageSize.IsZero() {
		c.StorageSize = resource.MustParse("1Gi")
	}
	if c.TmpSize.IsZero() {
		c.TmpSize = resource.MustParse("1Gi")
	}
	api, err := newKubeAPI(c.REST, c.Namespace, b.OnCall)
	if err != nil {
		return err
	}
	b.api = api
	sel := LabelComponent + "=intern"
	pods := api.pods().informer(sel, &corev1.Pod{})
	claims := api.claims().informer(sel, &corev1.PersistentVolumeClaim{})
	b.pods, b.claims = corelisters.NewPodLister(pods.GetIndexer()), corelisters.NewPersistentVolumeClaimLister(claims.GetIndexer())
	nudge := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { h.Changed() },
		UpdateFunc: func(any, any) { h.Changed() },
		DeleteFunc: func(any) { h.Changed() },
	}
	for _, inf := range []cache.SharedIndexInformer{pods, claims} {
		if _, err := inf.AddEventHandler(nudge); err != nil {
			return err
		}
	}
	b.informers = []cache.SharedIndexInformer{pods, claims}
	for _, inf := range b.informers {
		go inf.RunWithContext(ctx)
	}
	return nil
}

func (b *Backend) hasSynced() bool {
	for _, inf := range b.informers {
		if !inf.HasSynced() {
			return false
		}
	}
	return len(b.informers) > 0
}

// Observe lists the interns' Pods and claims from the informers' cache
// (complete once they have listed).
func (b *Backend) Observe() ([]provision.Observed, bool) {
	if !b.hasSynced() {
		return nil, false // the informers are still listing (or the API is away)
	}
	sel := labels.SelectorFromSet(labels.Set{LabelComponent: "intern"})
	pods, err := b.pods.List(sel)
	if err != nil {
		return nil, false
	}
	claims, err := b.claims.List(sel)
	if err != nil {
		return nil, false
	}
	out := make([]provision.Observed, 0, len(claims)+len(pods))
	has := make(map[string]bool, len(pods))
	for _, pod := range pods {
		id := pod.Labels[LabelIntern]
		has[id] = true
		out = append(out, provision.Observed{ID: id, Running: pod.DeletionTimestamp == nil, Ready: podReady(pod), URL: daemonURL(pod),
			Runs: b.podRunsOf(pod), Since: pod.CreationTimestamp.Time})
	}
	for _, c := range claims {
		if id := c.Labels[LabelIntern]; !has[id] {
			out = append(out, provision.Observed{ID: id})
		}
	}
	return out, true
}

// Fingerprint is what a Pod records of its spec (its annotations).
func (*Backend) Fingerprint(s provision.Spec) string {
	return podRuns(s.Model, s.Agent, kubeLimits(s.Limits))
}

func podRuns(model, agent, limits string) string { return model + "\x00" + agent + "\x00" + limits }

// podRunsOf is what pod runs: a Pod under another RuntimeClass than this
// gateway's runs something else, and is replaced.
func (b *Backend) podRunsOf(pod *corev1.Pod) string {
	r := podRuns(pod.Annotations[annModel], pod.Annotations[annAgent], pod.Annotations[annLimits])
	if c := pod.Spec.RuntimeClassName; (c == nil && b.Config.RuntimeClass != "") || (c != nil && *c != b.Config.RuntimeClass) {
		return r + "\x00runtime class changed"
	}
	return r
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// daemonURL is where a Pod's daemon answers.
func daemonURL(pod *corev1.Pod) string {
	if pod.Status.PodIP == "" {
		return ""
	}
	return "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(DaemonPort))
}

// Ensure brings the intern's Pod up: a Pod made for spec and its secret
// is kept (whichever replica made it), any other replaced; the daemon
// secret is in the row (Mint) before a new Pod exists, so whichever replica
// acts next can give the Pod its Secret.
func (b *Backend) Ensure(ctx context.Context, spec provision.Spec) (provision.Daemon, error) {
	pods := b.api.pods()
	pod, err := pods.Get(ctx, podName(spec.ID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = nil, nil
	}
	if err != nil {
		return provision.Daemon{}, err
	}
	current := pod != nil && spec.Secret != "" && pod.Annotations[annSecret] == spec.SecretTag &&
		b.podRunsOf(pod) == b.Fingerprint(spec)
	if pod != nil && (!current || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded) {
		// Stale (another secret, model or agent) or finished: a new one.
		if err := b.deleteObjects(ctx, spec.ID, pod, false); err != nil {
			return provision.Daemon{}, err
		}
		if err := b.waitPodGone(ctx, spec.ID); err != nil {
			return provision.Daemon{}, err
		}
		pod = nil
	}
	secret := spec.Secret
	if pod == nil {
		run, err := b.podAgent(spec.Agent)
		if err != nil {
			return provision.Daemon{}, err
		}
		var tag string
		if secret, tag, err = spec.Mint(ctx); err != nil {
			return provision.Daemon{}, err
		}
		if err := b.ensureClaim(ctx, spec.ID); err != nil {
			return provision.Daemon{}, err
		}
		pod, err = pods.Create(ctx, b.podFor(spec, tag, run), metav1.CreateOptions{})
		if err != nil {
			return provision.Daemon{}, err
		}
		b.log.Info("intern pod created", "intern", spec.ID, "pod", pod.Name)
	}
	if err := b.ensureSecret(ctx, spec.ID, pod, secret); err != nil {
		return provision.Daemon{}, err
	}
	url, err := b.waitPodReady(ctx, spec.ID)
	if err != nil {
		return provision.Daemon{}, err
	}
	return provision.Daemon{URL: url, Secret: secret, Log: []any{"pod", pod.Name}}, nil
}

// Sleep puts an intern's Pod away (sleep, suspend); its claim stays.
func (b *Backend) Sleep(ctx context.Context, id string) error {
	return b.deleteObjects(ctx, id, nil, false)
}

// Remove deletes everything of a deleted intern.
func (b *Backend) Remove(ctx context.Context, id string) error {
	return b.deleteObjects(ctx, id, nil, true)
}

// Close: Pods outlive the gateway; the informers stop with the context
// Open was given.
func (*Backend) Close() {}

// deleteObjects deletes the intern's Pod and its Secret (and its claim).
// pod is the intern's Pod when the caller has it; nil: it is read here.
func (b *Backend) deleteObjects(ctx context.Context, id string, pod *corev1.Pod, claim bool) error {
	api := b.api
	gone := func(err error) error {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	if pod == nil {
		var err error
		if pod, err = api.pods().Get(ctx, podName(id), metav1.GetOptions{}); gone(err) != nil {
			return err
		} else if err != nil {
			pod = nil
		}
	}
	// The Secret is owned by its Pod, so the cluster collects it too; it
	// goes first, by the name the Pod gives it, so that a replica dying in
	// between leaves a Pod to find it by (its name is the Pod's alone).
	if pod != nil {
		if name := podSecret(pod); name != "" {
			if err := gone(api.secrets().Delete(ctx, name, metav1.DeleteOptions{})); err != nil {
				return err
			}
		}
		if err := gone(api.pods().Delete(ctx, podName(id), metav1.DeleteOptions{})); err != nil {
			return err
		}
	}
	if claim {
		if err := gone(api.claims().Delete(ctx, claimName(id), metav1.DeleteOptions{})); err != nil {
			return err
		}
		b.log.Info("intern pod and claim deleted", "intern", id)
	} else {
		b.log.Info("intern pod deleted", "intern", id)
	}
	return nil
}

func (b *Backend) ensureClaim(ctx context.Context, id string) error {
	if _, err := b.claims.PersistentVolumeClaims(b.Config.Namespace).Get(claimName(id)); err == nil {
		return nil // claims are deleted only with their intern
	}
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName(id), Labels: internLabels(id)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: b.Config.StorageSize}},
		},
	}
	if b.Config.StorageClass != "" {
		c.Spec.StorageClassName = &b.Config.StorageClass
	}
	_, err := b.api.claims().Create(ctx, c, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ensureSecret gives the Pod its daemon secret, owned by the Pod so it
// goes with it. The Secret's name is the Pod's alone (secretName): one
// that exists was made for this Pod, so it is never read back.
func (b *Backend) ensureSecret(ctx context.Context, id string, pod *corev1.Pod, secret string) error {
	name := podSecret(pod)
	if name == "" {
		return errors.New("the intern's pod names no daemon secret")
	}
	yes := true
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: internLabels(id),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, BlockOwnerDeletion: &yes}}},
		Type:      corev1.SecretTypeOpaque,
		Immutable: &yes,
		Data:      map[string][]byte{"secret": []byte(secret), "relay-token": []byte(relayToken(secret, id))},
	}
	_, err := b.api.secrets().Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// waitPodReady waits for the intern's Pod to be ready, and returns its
// daemon's URL. It reads the informer's cache, which the watch keeps
// current, and asks the API itself once a second in case the watch is
// down: a wake costs a few requests, not one per look.
func (b *Backend) waitPodReady(ctx context.Context, id string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, b.Config.WakeTimeout)
	defer cancel()
	asked := time.Now()
	for {
		pod, err := b.pods.Pods(b.Config.Namespace).Get(podName(id))
		if time.Since(asked) >= time.Second && (err != nil || !podReady(pod)) {
			asked = time.Now()
			pod, err = b.api.pods().Get(ctx, podName(id), metav1.GetOptions{})
			if err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
				return "", err
			}
		}
		switch {
		case err == nil && pod.DeletionTimestamp != nil:
			return "", errors.New("the intern's pod is being deleted")
		case err == nil && pod.Status.Phase == corev1.PodFailed:
			return "", fmt.Errorf("the intern's pod failed: %s", pod.Status.Message)
		case err == nil && podReady(pod):
			return daemonURL(pod), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("the intern's pod was not ready within %s", b.Config.WakeTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (b *Backend) waitPodGone(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, b.Config.WakeTimeout)
	defer cancel()
	for {
		_, err := b.api.pods().Get(ctx, podName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				// Not a slow Pod: the API server did not answer (#42).
				return fmt.Errorf("the intern's old pod did not go away in time; the last look at it failed: %w", err)
			}
			return errors.New("the intern's old pod did not go away in time")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func internLabels(id string) map[string]string {
	return map[string]string{LabelName: "cohort", LabelComponent: "intern", LabelIntern: id}
}

// podAgent is how a Pod runs the intern's agent: as in a jail (the key
// placeholder, the relay for the endpoint), with the image's modules.
func (b *Backend) podAgent(name string) (provision.AgentRun, error) {
	run, err := b.Agents.For(name, true)
	if err != nil || run.Upstream == "" {
		return run, err
	}
	if b.Config.AgentModules == "" {
		return provision.AgentRun{}, fmt.Errorf("agent %q: the known third-party agents run in Pods only with --kube-agent-modules, their node_modules in the image (docs/kubernetes.md)", name)
	}
	run.Launch.Modules = b.Config.AgentModules
	return run, nil
}

// podEnv is the container's environment: the daemon secret and the relay
// token from the Secret (never values in the spec), and the agent's model
// endpoint, the gateway's relay.
func (b *Backend) podEnv(in provision.Spec, tag string, run provision.AgentRun) []corev1.EnvVar {
	fromSecret := func(key string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secretName(in.ID, tag)}, Key: key}}
	}
	// $(…) is expanded by the kubelet from the variables before it.
	relay := b.Config.RelayURL + in.ID + "/$(COHORT_MODEL_RELAY_TOKEN)"
	env := []corev1.EnvVar{
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "COHORT_INTERN_SECRET", ValueFrom: fromSecret("secret")},
		{Name: "COHORT_MODEL_RELAY_TOKEN", ValueFrom: fromSecret("relay-token")},
		{Name: "HOME", Value: "/tmp"},
		{Name: "COHORT_AGENT_BASE_URL", Value: relay + b.Config.ModelPath},
	}
	if run.Upstream != "" {
		if u, err := url.Parse(run.Upstream); err == nil {
			env = append(env, corev1.EnvVar{Name: "COHORT_AGENT_PROVIDER_URL", Value: relay + strings.TrimRight(u.EscapedPath(), "/")})
		}
	}
	if b.Config.ModelKeyPlaceholder != "" {
		env = append(env, corev1.EnvVar{Name: "COHORT_AGENT_API_KEY", Value: b.Config.ModelKeyPlaceholder})
	}
	for _, kv := range b.Config.AgentEnv {
		if name, v, ok := strings.Cut(kv, "="); ok {
			env = append(env, corev1.EnvVar{Name: name, Value: v})
		}
	}
	return env
}

// podFor is the intern's Pod: its daemon and agent, non-root on a
// read-only root filesystem, with no service-account token; the daemon
// secret comes from the Secret, never from the spec.
func (b *Backend) podFor(in provision.Spec, tag string, run provision.AgentRun) *corev1.Pod {
	d := launch.Daemon{Listen: "$(POD_IP):" + strconv.Itoa(DaemonPort), DataDir: podDataDir, InternID: in.ID, Model: in.Model,
		GatewayURL: b.Config.GatewayURL, InteractionDeadline: max(b.InteractionDeadline, 0), Agent: run.Launch}
	args := append([]string{"intern"}, d.Args()...)
	no, yes := false, true
	uid := int64(podUID)
	tmp := podTmpSize(b.Config.TmpSize, in.Limits)
	ann := map[string]string{annSecret: tag, annModel: in.Model, annAgent: in.Agent}
	if l := kubeLimits(in.Limits); l != "" {
		ann[annLimits] = l
	}
	var runtimeClass *string
	if rc := b.Config.RuntimeClass; rc != "" {
		runtimeClass = &rc
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(in.ID), Labels: internLabels(in.ID), Annotations: ann},
		Spec: corev1.PodSpec{
			RuntimeClassName:             runtimeClass,
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			RestartPolicy:                corev1.RestartPolicyAlways,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name:    "intern",
				Image:   b.Config.Image,
				Command: []string{"/cohort"},
				Args:    args,
				Env:     b.podEnv(in, tag, run),
				Ports:   []corev1.ContainerPort{{Name: "daemon", ContainerPort: DaemonPort}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrPort(DaemonPort)}},
					PeriodSeconds: 1},
				Resources: podResources(b.Config.Requests, b.Config.Limits, in.Limits),
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: &yes, ReadOnlyRootFilesystem: &yes, AllowPrivilegeEscalation: &no,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: podDataDir}, {Name: "tmp", MountPath: "/tmp"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName(in.ID)}}},
				// Every ephemeral volume is size-limited (the interns' admission
				// policy refuses one that is not).
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &tmp}}},
			},
		},
	}
}

// Claim takes the intern's Lease for this replica and keeps renewing it
// until the returned release, which gives it up. ErrBusy: another live
// replica holds it.
func (b *Backend) Claim(ctx context.Context, id string) (release func(), err error) {
	leases := b.api.leases()
	secs := int32(b.Config.LeaseDuration / time.Second)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, leaseName(id), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l, err = leases.Create(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName(id), Labels: internLabels(id)},
			Spec: coordv1.LeaseSpec{HolderIdentity: &b.Config.Identity, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, provision.ErrBusy
		}
	case err == nil:
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if holder != "" && holder != b.Config.Identity && !leaseExpired(l) {
			return nil, provision.ErrBusy
		}
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.AcquireTime, l.Spec.RenewTime = &b.Config.Identity, &secs, &now, &now
		l, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return nil, provision.ErrBusy
		}
	}
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(b.Config.LeaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(context.Background(), b.Config.LeaseDuration/3)
				now := metav1.NewMicroTime(time.Now())
				l.Spec.RenewTime = &now
				if nl, err := leases.Update(rctx, l, metav1.UpdateOptions{}); err == nil {
					l = nl
				}
				cancel()
			}
		}
	}()
	return func() {
		close(stop)
		<-done
		// Given up by deleting it, only if it is still ours as last seen.
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rv := l.ResourceVersion
		leases.Delete(dctx, leaseName(id), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	}, nil
}

func leaseExpired(l *coordv1.Lease) bool {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	return time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
}

func intstrPort(n int) intstr.IntOrString { return intstr.FromInt32(int32(n)) }
