package provision

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/uptrace/bun"
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

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
	"github.com/cohort-dev/cohort/internal/store"
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

// Kubernetes is the provisioner mode that runs interns as Pods.
const Kubernetes = "kubernetes"

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

// KubeConfig is what the Kubernetes provisioner needs.
type KubeConfig struct {
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

// errHeld says another replica acts on the intern now.
var errHeld = errors.New("another gateway replica is acting on this intern")

// kubeFleet is the provisioner's state in Kubernetes mode.
type kubeFleet struct {
	cfg       *KubeConfig
	api       *kubeAPI
	informers []cache.SharedIndexInformer
	pods      corelisters.PodLister
	claims    corelisters.PersistentVolumeClaimLister

	mu     sync.Mutex
	acting map[string]*action
	used   map[string]time.Time // this replica's last call to each intern
	// held is when an action on an intern last failed or found another
	// replica holding its Lease: the reconciler leaves that intern alone
	// for a while (every Pod event nudges it, each try costs requests, and
	// an API server that is away would fill the log).
	held map[string]time.Time
	// nextLook is when the sleeper asks an intern's daemon again: not
	// before its reported idle time could reach the timeout.
	nextLook map[string]time.Time
}

// action is one replica's work on one intern; concurrent callers share it.
type action struct {
	done chan struct{}
	err  error
}

func (k *kubeFleet) init(p *Provisioner) error {
	c := k.cfg
	if c.WakeTimeout <= 0 {
		c.WakeTimeout = 2 * time.Minute
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 15 * time.Second
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		c.Identity = host + "-" + strconv.Itoa(os.Getpid()) + "-" + newSecret()[:6]
	}
	if c.StorageSize.IsZero() {
		c.StorageSize = resource.MustParse("1Gi")
	}
	if c.TmpSize.IsZero() {
		c.TmpSize = resource.MustParse("1Gi")
	}
	k.acting = map[string]*action{}
	k.used = map[string]time.Time{}
	k.held = map[string]time.Time{}
	k.nextLook = map[string]time.Time{}
	api, err := newKubeAPI(c.REST, c.Namespace, p.OnKubeCall)
	if err != nil {
		return err
	}
	k.api = api
	sel := LabelComponent + "=intern"
	pods := api.pods().informer(sel, &corev1.Pod{})
	claims := api.claims().informer(sel, &corev1.PersistentVolumeClaim{})
	k.pods, k.claims = corelisters.NewPodLister(pods.GetIndexer()), corelisters.NewPersistentVolumeClaimLister(claims.GetIndexer())
	nudge := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.nudge() },
		UpdateFunc: func(any, any) { p.nudge() },
		DeleteFunc: func(any) { p.nudge() },
	}
	for _, inf := range []cache.SharedIndexInformer{pods, claims} {
		if _, err := inf.AddEventHandler(nudge); err != nil {
			return err
		}
	}
	k.informers = []cache.SharedIndexInformer{pods, claims}
	return nil
}

// start runs the informers until ctx ends.
func (k *kubeFleet) start(ctx context.Context) {
	for _, inf := range k.informers {
		go inf.RunWithContext(ctx)
	}
}

func (k *kubeFleet) hasSynced() bool {
	for _, inf := range k.informers {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// act runs f for the intern unless this replica already acts on it, in
// which case the caller shares that action.
func (p *Provisioner) act(id string, f func(ctx context.Context, id string) error) *action {
	k := p.kube
	k.mu.Lock()
	defer k.mu.Unlock()
	if a := k.acting[id]; a != nil {
		return a
	}
	a := &action{done: make(chan struct{})}
	k.acting[id] = a
	go func() {
		ctx, cancel := context.WithTimeout(p.fleetCtx, k.cfg.WakeTimeout+k.cfg.LeaseDuration)
		defer cancel()
		a.err = f(ctx, id)
		k.mu.Lock()
		delete(k.acting, id)
		if a.err != nil {
			k.held[id] = time.Now()
		} else {
			delete(k.held, id)
		}
		k.mu.Unlock()
		close(a.done)
		if a.err != nil && !errors.Is(a.err, errHeld) && ctx.Err() == nil {
			p.Log.Warn("intern pod", "intern", id, "err", a.err)
		}
	}()
	return a
}

// heldBackoff is how long the reconciler leaves an intern whose action
// failed or whose Lease another replica holds; a holder that died is taken
// over within it of its Lease's expiry.
const heldBackoff = 2 * time.Second

// actSoon is act, unless an action on the intern failed or found another
// replica acting within heldBackoff.
func (p *Provisioner) actSoon(id string, f func(ctx context.Context, id string) error) {
	k := p.kube
	k.mu.Lock()
	recent := time.Since(k.held[id]) < heldBackoff
	k.mu.Unlock()
	if !recent {
		p.act(id, f)
	}
}

// reconcileKube makes the Pods match the database: one ready Pod for each
// intern in provisioning or running, none for the others, and no claim
// of a deleted intern.
func (p *Provisioner) reconcileKube(ctx context.Context) error {
	k := p.kube
	if !k.hasSynced() {
		return nil // the informers are still listing (or the API is away)
	}
	var rows []store.Intern
	if err := p.DB.NewSelect().Model(&rows).Column("id", "state", "daemon_url", "model", "agent", "limit_memory", "limit_cpus", "limit_tmpfs").
		Where("state IN (?)", bun.In([]string{store.InternProvisioning, store.InternRunning})).Scan(ctx); err != nil {
		return err
	}
	sel := labels.SelectorFromSet(labels.Set{LabelComponent: "intern"})
	pods, err := k.pods.List(sel)
	if err != nil {
		return err
	}
	claims, err := k.claims.List(sel)
	if err != nil {
		return err
	}
	podOf := make(map[string]*corev1.Pod, len(pods))
	for _, pod := range pods {
		podOf[pod.Labels[LabelIntern]] = pod
	}
	want := make(map[string]bool, len(rows))
	for i := range rows {
		in := &rows[i]
		want[in.ID] = true
		pod := podOf[in.ID]
		if in.State == store.InternProvisioning || pod == nil || pod.DeletionTimestamp != nil || !podReady(pod) || daemonURL(pod) != in.DaemonURL ||
			pod.Annotations[annModel] != in.Model || pod.Annotations[annAgent] != in.Agent ||
			pod.Annotations[annLimits] != kubeLimits(in.Limits) {
			// The cache may lag: ensure reads the Pod itself first.
			p.actSoon(in.ID, p.ensurePod)
		}
	}
	// Objects of interns that should not be awake: whose rows say so (or
	// are gone) is read in one query.
	var others []string
	for id := range podOf {
		if !want[id] {
			others = append(others, id)
		}
	}
	for _, c := range claims {
		if id := c.Labels[LabelIntern]; !want[id] && podOf[id] == nil {
			others = append(others, id)
		}
	}
	if len(others) == 0 {
		return nil
	}
	var states []store.Intern
	if err := p.DB.NewSelect().Model(&states).Column("id", "state").Where("id IN (?)", bun.In(others)).Scan(ctx); err != nil {
		return err
	}
	state := make(map[string]string, len(states))
	for _, s := range states {
		state[s.ID] = s.State
	}
	for _, id := range others {
		st, ok := state[id]
		switch {
		case !ok || st == store.InternDeleted:
			p.actSoon(id, p.removeIntern)
		case podOf[id] != nil && podOf[id].DeletionTimestamp == nil:
			p.actSoon(id, p.removePod)
		}
	}
	return nil
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

// secretDigest names a wrapped daemon secret without revealing it.
func secretDigest(wrapped string) string {
	s := sha256.Sum256([]byte(wrapped))
	return hex.EncodeToString(s[:12])
}

// ensurePod brings the intern's Pod up and its row to running, holding
// the intern's Lease.
func (p *Provisioner) ensurePod(ctx context.Context, id string) error {
	k := p.kube
	release, err := p.lease(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	in, err := p.row(ctx, id)
	if errors.Is(err, errNoRows) {
		return p.deleteObjects(ctx, id, nil, true)
	}
	if err != nil {
		return err
	}
	if in.State != store.InternProvisioning && in.State != store.InternRunning {
		return p.deleteObjects(ctx, id, nil, in.State == store.InternDeleted)
	}
	pods := k.api.pods()
	pod, err := pods.Get(ctx, podName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = nil, nil
	}
	if err != nil {
		return err
	}
	current := pod != nil && pod.Annotations[annSecret] == secretDigest(in.DaemonSecret) &&
		pod.Annotations[annModel] == in.Model && pod.Annotations[annAgent] == in.Agent &&
		pod.Annotations[annLimits] == kubeLimits(in.Limits)
	if current && in.State == store.InternRunning && podReady(pod) && daemonURL(pod) == in.DaemonURL {
		return nil // the cache lagged
	}
	if pod != nil && (!current || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded) {
		// Stale (another secret, model or agent) or finished: a new one.
		if err := p.deleteObjects(ctx, id, pod, false); err != nil {
			return err
		}
		if err := p.waitPodGone(ctx, id); err != nil {
			return err
		}
		pod = nil
	}
	if in.State == store.InternRunning && (pod == nil || !podReady(pod)) {
		// Its Pod is gone or not ready: chat waits instead of dialing it.
		if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).Set("state = ?", store.InternProvisioning).
			Set("updated_at = ?", store.Now(nil)).Where("id = ? AND state = ?", id, store.InternRunning).Exec(ctx); err != nil {
			return err
		}
	}
	var secret string
	fresh := pod == nil
	if fresh {
		run, err := p.podAgent(in.Agent)
		if err != nil {
			return err
		}
		// The secret is in the row before the Pod exists: whichever
		// replica acts next can give the Pod its Secret.
		secret = newSecret()
		wrapped, err := p.wrap(id, secret)
		if err != nil {
			return err
		}
		res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
			Set("daemon_secret = ?", wrapped).Set("daemon_url = ''").Set("provisioner = ?", Kubernetes).
			Where("id = ? AND state = ?", id, store.InternProvisioning).Exec(ctx)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return nil // suspended or deleted meanwhile: the next pass
		}
		in.DaemonSecret = wrapped
		if err := p.ensureClaim(ctx, id); err != nil {
			return err
		}
		pod, err = pods.Create(ctx, p.podFor(in, run), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		p.Log.Info("intern pod created", "intern", id, "pod", pod.Name)
	} else if secret, err = p.unwrap(in); err != nil {
		return err
	}
	if err := p.ensureSecret(ctx, id, pod, secret); err != nil {
		return err
	}
	url, err := p.waitPodReady(ctx, id)
	if err != nil {
		return err
	}
	if err := p.waitHealthy(ctx, url, secret); err != nil {
		return err
	}
	if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("daemon_url = ?", url).Set("state = ?", store.InternRunning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state IN (?) AND daemon_secret = ?", id, bun.In([]string{store.InternProvisioning, store.InternRunning}), in.DaemonSecret).
		Exec(ctx); err != nil {
		return err
	}
	p.Log.Info("intern pod running", "intern", id, "url", url)
	return nil
}

// removePod puts an intern's Pod away (sleep, suspend); its claim stays.
func (p *Provisioner) removePod(ctx context.Context, id string) error {
	return p.removeWith(ctx, id, false)
}

// removeIntern deletes everything of a deleted intern.
func (p *Provisioner) removeIntern(ctx context.Context, id string) error {
	return p.removeWith(ctx, id, true)
}

func (p *Provisioner) removeWith(ctx context.Context, id string, claim bool) error {
	release, err := p.lease(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	// The row may have changed since the pass looked.
	if in, err := p.row(ctx, id); err == nil && (in.State == store.InternProvisioning || in.State == store.InternRunning) {
		return nil
	} else if err == nil {
		claim = in.State == store.InternDeleted
	}
	return p.deleteObjects(ctx, id, nil, claim)
}

// deleteObjects deletes the intern's Pod and its Secret (and its claim).
// pod is the intern's Pod when the caller has it; nil: it is read here.
func (p *Provisioner) deleteObjects(ctx context.Context, id string, pod *corev1.Pod, claim bool) error {
	api := p.kube.api
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
		p.Log.Info("intern pod and claim deleted", "intern", id)
	} else {
		p.Log.Info("intern pod deleted", "intern", id)
	}
	return nil
}

func (p *Provisioner) ensureClaim(ctx context.Context, id string) error {
	k := p.kube
	if _, err := k.claims.PersistentVolumeClaims(k.cfg.Namespace).Get(claimName(id)); err == nil {
		return nil // claims are deleted only with their intern
	}
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claimName(id), Labels: internLabels(id)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: k.cfg.StorageSize}},
		},
	}
	if k.cfg.StorageClass != "" {
		c.Spec.StorageClassName = &k.cfg.StorageClass
	}
	_, err := k.api.claims().Create(ctx, c, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// ensureSecret gives the Pod its daemon secret, owned by the Pod so it
// goes with it. The Secret's name is the Pod's alone (secretName): one
// that exists was made for this Pod, so it is never read back.
func (p *Provisioner) ensureSecret(ctx context.Context, id string, pod *corev1.Pod, secret string) error {
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
	_, err := p.kube.api.secrets().Create(ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// waitPodReady waits for the intern's Pod to be ready, and returns its
// daemon's URL. It reads the informer's cache, which the watch keeps
// current, and asks the API itself once a second in case the watch is
// down: a wake costs a few requests, not one per look.
func (p *Provisioner) waitPodReady(ctx context.Context, id string) (string, error) {
	k := p.kube
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WakeTimeout)
	defer cancel()
	asked := time.Now()
	for {
		pod, err := k.pods.Pods(k.cfg.Namespace).Get(podName(id))
		if time.Since(asked) >= time.Second && (err != nil || !podReady(pod)) {
			asked = time.Now()
			pod, err = k.api.pods().Get(ctx, podName(id), metav1.GetOptions{})
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
			return "", fmt.Errorf("the intern's pod was not ready within %s", k.cfg.WakeTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *Provisioner) waitPodGone(ctx context.Context, id string) error {
	k := p.kube
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WakeTimeout)
	defer cancel()
	for {
		_, err := k.api.pods().Get(ctx, podName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
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
func (p *Provisioner) podAgent(name string) (agentRun, error) {
	run, err := p.agentFor(name, true)
	if err != nil || run.upstream == "" {
		return run, err
	}
	if p.kube.cfg.AgentModules == "" {
		return agentRun{}, fmt.Errorf("agent %q: the known third-party agents run in Pods only with --kube-agent-modules, their node_modules in the image (docs/kubernetes.md)", name)
	}
	for i := range run.flags {
		if run.flags[i] == "--agent-modules" && i+1 < len(run.flags) {
			run.flags[i+1] = p.kube.cfg.AgentModules
		}
	}
	return run, nil
}

// podEnv is the container's environment: the daemon secret and the relay
// token from the Secret (never values in the spec), and the agent's model
// endpoint, the gateway's relay.
func (p *Provisioner) podEnv(in *store.Intern, run agentRun) []corev1.EnvVar {
	k := p.kube
	fromSecret := func(key string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secretName(in.ID, secretDigest(in.DaemonSecret))}, Key: key}}
	}
	// $(…) is expanded by the kubelet from the variables before it.
	relay := k.cfg.RelayURL + in.ID + "/$(COHORT_MODEL_RELAY_TOKEN)"
	env := []corev1.EnvVar{
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "COHORT_INTERN_SECRET", ValueFrom: fromSecret("secret")},
		{Name: "COHORT_MODEL_RELAY_TOKEN", ValueFrom: fromSecret("relay-token")},
		{Name: "HOME", Value: "/tmp"},
		{Name: "COHORT_AGENT_BASE_URL", Value: relay + k.cfg.ModelPath},
	}
	if run.upstream != "" {
		if u, err := url.Parse(run.upstream); err == nil {
			env = append(env, corev1.EnvVar{Name: "COHORT_AGENT_PROVIDER_URL", Value: relay + strings.TrimRight(u.EscapedPath(), "/")})
		}
	}
	if k.cfg.ModelKeyPlaceholder != "" {
		env = append(env, corev1.EnvVar{Name: "COHORT_AGENT_API_KEY", Value: k.cfg.ModelKeyPlaceholder})
	}
	for _, kv := range k.cfg.AgentEnv {
		if name, v, ok := strings.Cut(kv, "="); ok {
			env = append(env, corev1.EnvVar{Name: name, Value: v})
		}
	}
	return env
}

// podFor is the intern's Pod: its daemon and agent, non-root on a
// read-only root filesystem, with no service-account token; the daemon
// secret comes from the Secret, never from the spec.
func (p *Provisioner) podFor(in *store.Intern, run agentRun) *corev1.Pod {
	k := p.kube
	args := []string{"intern", "--listen", "$(POD_IP):" + strconv.Itoa(DaemonPort), "--data-dir", podDataDir,
		"--intern-id", in.ID, "--model", in.Model, "--gateway-url", k.cfg.GatewayURL}
	if p.InteractionDeadline > 0 {
		args = append(args, "--interaction-deadline", p.InteractionDeadline.String())
	}
	args = append(args, run.flags...)
	no, yes := false, true
	uid := int64(podUID)
	tmp := podTmpSize(k.cfg.TmpSize, in.Limits)
	ann := map[string]string{annSecret: secretDigest(in.DaemonSecret), annModel: in.Model, annAgent: in.Agent}
	if l := kubeLimits(in.Limits); l != "" {
		ann[annLimits] = l
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(in.ID), Labels: internLabels(in.ID), Annotations: ann},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: &no,
			EnableServiceLinks:           &no,
			RestartPolicy:                corev1.RestartPolicyAlways,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name:    "intern",
				Image:   k.cfg.Image,
				Command: []string{"/cohort"},
				Args:    args,
				Env:     p.podEnv(in, run),
				Ports:   []corev1.ContainerPort{{Name: "daemon", ContainerPort: DaemonPort}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstrPort(DaemonPort)}},
					PeriodSeconds: 1},
				Resources: podResources(k.cfg.Requests, k.cfg.Limits, in.Limits),
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

// lease takes the intern's Lease for this replica and keeps renewing it
// until the returned release, which gives it up. errHeld: another live
// replica holds it.
func (p *Provisioner) lease(ctx context.Context, id string) (release func(), err error) {
	k := p.kube
	leases := k.api.leases()
	secs := int32(k.cfg.LeaseDuration / time.Second)
	now := metav1.NewMicroTime(time.Now())
	l, err := leases.Get(ctx, leaseName(id), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		l, err = leases.Create(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName(id), Labels: internLabels(id)},
			Spec: coordv1.LeaseSpec{HolderIdentity: &k.cfg.Identity, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil, errHeld
		}
	case err == nil:
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if holder != "" && holder != k.cfg.Identity && !leaseExpired(l) {
			return nil, errHeld
		}
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.AcquireTime, l.Spec.RenewTime = &k.cfg.Identity, &secs, &now, &now
		l, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			return nil, errHeld
		}
	}
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(k.cfg.LeaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				rctx, cancel := context.WithTimeout(context.Background(), k.cfg.LeaseDuration/3)
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

// wakeKube wakes a sleeping (or waits for a provisioning) intern: this
// replica acts unless another holds the intern's Lease, in which case it
// waits for the row to say running, taking over if the other stops.
func (p *Provisioner) wakeKube(ctx context.Context, in *store.Intern) (*store.Intern, error) {
	ctx, cancel := context.WithTimeout(ctx, p.kube.cfg.WakeTimeout)
	defer cancel()
	if _, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
		Set("state = ?", store.InternProvisioning).Set("updated_at = ?", store.Now(nil)).
		Where("id = ? AND state = ?", in.ID, store.InternSleeping).Exec(ctx); err != nil {
		return nil, errUnreachable.WithCause(err)
	}
	late := func() error {
		return apierr.New(http.StatusBadGateway, "intern_unreachable", "the intern could not be woken in time").WithCause(ctx.Err())
	}
	var tried time.Time
	for {
		// While another replica holds the Lease, the row is read often and
		// the Lease once a second: it is taken over when it expires.
		if time.Since(tried) >= time.Second {
			tried = time.Now()
			a := p.act(in.ID, p.ensurePod)
			select {
			case <-a.done:
			case <-ctx.Done():
				return nil, late()
			}
			if a.err != nil && !errors.Is(a.err, errHeld) {
				return nil, wakeError(a.err)
			}
		}
		row, err := p.row(ctx, in.ID)
		if err != nil {
			return nil, errUnreachable.WithCause(err)
		}
		if row.State != store.InternProvisioning {
			return row, nil // running, or suspended or deleted meanwhile
		}
		select {
		case <-ctx.Done():
			return nil, late()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sleepIdleKube puts to sleep every awake intern idle for IdleTimeout on
// every replica: the daemon's own idle time says so, asked only of Pods
// this replica has not used meanwhile.
func (p *Provisioner) sleepIdleKube(ctx context.Context) {
	k := p.kube
	if !k.hasSynced() {
		return
	}
	pods, err := k.pods.List(labels.SelectorFromSet(labels.Set{LabelComponent: "intern"}))
	if err != nil {
		return
	}
	now := time.Now()
	cutoff := now.Add(-p.IdleTimeout)
	for _, pod := range pods {
		id := pod.Labels[LabelIntern]
		k.mu.Lock()
		used, next := k.used[id], k.nextLook[id]
		k.mu.Unlock()
		if !podReady(pod) || used.After(cutoff) || pod.CreationTimestamp.Time.After(cutoff) || now.Before(next) {
			continue
		}
		in, err := p.row(ctx, id)
		if err != nil || in.State != store.InternRunning || in.DaemonURL != daemonURL(pod) {
			continue
		}
		secret, err := p.unwrap(in)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := p.dial("", in.DaemonURL, secret).Status(sctx, connect.NewRequest(&pb.StatusRequest{}))
		cancel()
		if err != nil || st.Msg.GetLiveRuns() > 0 || st.Msg.GetPausedRuns() > 0 || time.Duration(st.Msg.GetIdleMs())*time.Millisecond < p.IdleTimeout {
			if err == nil && st.Msg.GetLiveRuns() == 0 && st.Msg.GetPausedRuns() == 0 {
				// Used through another replica: idle again at the soonest then.
				k.mu.Lock()
				k.nextLook[id] = now.Add(p.IdleTimeout - time.Duration(st.Msg.GetIdleMs())*time.Millisecond)
				k.mu.Unlock()
			}
			continue
		}
		res, err := p.DB.NewUpdate().Model((*store.Intern)(nil)).
			Set("state = ?", store.InternSleeping).Set("updated_at = ?", store.Now(nil)).
			Where("id = ? AND state = ? AND daemon_url = ?", id, store.InternRunning, in.DaemonURL).Exec(ctx)
		if err != nil {
			p.Log.Error("put intern to sleep", "intern", id, "err", err)
			continue
		}
		k.mu.Lock()
		delete(k.nextLook, id)
		k.mu.Unlock()
		if n, _ := res.RowsAffected(); n == 1 {
			p.Log.Info("intern asleep", "intern", id, "idle", (time.Duration(st.Msg.GetIdleMs()) * time.Millisecond).Round(time.Second).String())
			p.nudge()
		}
	}
}

func intstrPort(n int) intstr.IntOrString { return intstr.FromInt32(int32(n)) }
