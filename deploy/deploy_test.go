package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/cohort-dev/cohort/internal/testing/kubetest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

const (
	gatewayNS = "cohort"
	internsNS = "cohort-interns"
	gatewaySA = "system:serviceaccount:cohort:cohort"
)

// manifest is one object of one listed file, in file order.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	return fmt.Sprintf("%s: %s %s/%s", m.file, m.obj.GetKind(), m.obj.GetNamespace(), m.obj.GetName())
}

// manifests reads every file kustomization.yaml lists, in its order. It
// fails when the kustomization does more than list files (the tests would
// then validate something other than what kubectl applies), when a listed
// file is missing, or when a YAML file here is not listed (it would look
// deployed and never be).
func manifests(t *testing.T) []manifest {
	t.Helper()
	raw, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	js, err := k8syaml.ToJSON(raw)
	if err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	var k map[string]any
	if err := json.Unmarshal(js, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	for key := range k {
		if key != "apiVersion" && key != "kind" && key != "resources" {
			t.Errorf("kustomization.yaml: %q transforms the files; keep it a resources list and put transforms in an overlay (docs/kubernetes.md)", key)
		}
	}
	var listed []string
	rs, _ := k["resources"].([]any)
	for _, r := range rs {
		s, ok := r.(string)
		if !ok {
			t.Fatalf("kustomization.yaml: resource %v is not a file name", r)
		}
		listed = append(listed, s)
	}
	if len(listed) == 0 {
		t.Fatal("kustomization.yaml lists no resources")
	}

	present, err := filepath.Glob("*.y*ml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range present {
		if f != "kustomization.yaml" && !slices.Contains(listed, f) {
			t.Errorf("%s is not listed in kustomization.yaml", f)
		}
	}

	var out []manifest
	for _, f := range listed {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", f, err)
			continue
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			js, err := k8syaml.ToJSON(doc)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if s := strings.TrimSpace(string(js)); s == "null" || s == "" {
				continue // a comment-only document
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(js); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, manifest{file: f, obj: u})
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// docsPath is the operator's guide, whose YAML examples are validated too.
const docsPath = "../docs/kubernetes.md"

// docExamples returns the Kubernetes objects of docs/kubernetes.md's
// ```yaml blocks; kustomizations are left out (they are not API objects).
func docExamples(t *testing.T) []manifest {
	t.Helper()
	b, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	blocks := strings.Split(string(b), "```yaml\n")[1:]
	for i, blk := range blocks {
		end := strings.Index(blk, "```")
		if end < 0 {
			t.Fatalf("%s: yaml block %d is not closed", docsPath, i+1)
		}
		js, err := k8syaml.ToJSON([]byte(blk[:end]))
		if err != nil {
			t.Fatalf("%s: yaml block %d: %v", docsPath, i+1, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: yaml block %d: %v", docsPath, i+1, err)
		}
		if u.GetKind() != "Kustomization" {
			out = append(out, manifest{file: fmt.Sprintf("%s block %d", docsPath, i+1), obj: u})
		}
	}
	return out
}

// find returns the one object of kind and name, as a typed value.
func find[T any](t *testing.T, ms []manifest, kind, namespace, name string) *T {
	t.Helper()
	for _, m := range ms {
		if m.obj.GetKind() == kind && m.obj.GetNamespace() == namespace && m.obj.GetName() == name {
			v := new(T)
			// Strict: a misspelt field would otherwise vanish silently here.
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(m.obj.Object, v, true); err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			return v
		}
	}
	t.Fatalf("no %s %s/%s in the listed files", kind, namespace, name)
	return nil
}

func subset(small, big map[string]string) bool {
	for k, v := range small {
		if big[k] != v {
			return false
		}
	}
	return len(small) > 0
}

// TestManifestsStatic checks what needs no API server: the set of objects,
// the gateway's Pod template, and that Service, URL and policies select
// what they mean to. It runs even where kube-apiserver is unavailable.
func TestManifestsStatic(t *testing.T) {
	ms := manifests(t)

	// Nothing cluster-wide but the two namespaces and the gateway's
	// admission policies, and no Secret: the operator creates those
	// (docs/kubernetes.md), they are never shipped.
	for _, m := range ms {
		switch kind := m.obj.GetKind(); {
		case kind == "Namespace":
			if n := m.obj.GetName(); n != gatewayNS && n != internsNS {
				t.Errorf("%s: unexpected namespace", m)
			}
		case kind == "ValidatingAdmissionPolicy", kind == "ValidatingAdmissionPolicyBinding":
			if !strings.HasPrefix(m.obj.GetName(), "cohort-gateway-") {
				t.Errorf("%s: unexpected admission policy", m)
			}
		case kind == "Secret", strings.HasPrefix(kind, "Cluster"):
			t.Errorf("%s: must not be in deploy/", m)
		case m.obj.GetNamespace() != gatewayNS && m.obj.GetNamespace() != internsNS:
			t.Errorf("%s: every object names the cohort or cohort-interns namespace", m)
		}
	}
	for _, ns := range []string{gatewayNS, internsNS} {
		n := find[corev1.Namespace](t, ms, "Namespace", "", ns)
		if n.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
			t.Errorf("namespace %s does not enforce the restricted Pod Security Standard", ns)
		}
	}

	dep := find[appsv1.Deployment](t, ms, "Deployment", gatewayNS, "cohort")
	pod := dep.Spec.Template.Spec
	labels := dep.Spec.Template.Labels
	if labels["app.kubernetes.io/name"] != "cohort" || labels["app.kubernetes.io/component"] != "gateway" {
		t.Errorf("gateway Pod labels %v", labels)
	}
	if pod.ServiceAccountName != "cohort" {
		t.Errorf("serviceAccountName %q", pod.ServiceAccountName)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the gateway shares a host namespace")
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("the gateway Pod is not non-root: %+v", psc)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("the gateway Pod has no RuntimeDefault seccomp profile")
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath", v.Name)
		}
	}
	if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
		t.Fatalf("want exactly one container, got %d (+%d init)", len(pod.Containers), len(pod.InitContainers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("the gateway container has no securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("the gateway's root filesystem is writable")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("the gateway may escalate privileges")
	case sc.Privileged != nil && *sc.Privileged:
		t.Error("the gateway is privileged")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v: want drop ALL, add none", sc.Capabilities)
	case sc.RunAsUser != nil && *sc.RunAsUser == 0:
		t.Error("the gateway container runs as root")
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != 8080 || ports["metrics"] != 9090 {
		t.Errorf("container ports %v: want http 8080, metrics 9090", ports)
	}
	probe := func(name string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "http" {
			t.Errorf("%s probe: want httpGet %s on port http, got %+v", name, path, p)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")

	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
		// A literal value is never a credential: no userinfo in a URL, no
		// secret-sounding variable set inline.
		if e.Value != "" {
			if u, err := url.Parse(e.Value); err == nil && u.User != nil {
				t.Errorf("%s carries credentials in the manifest", e.Name)
			}
			for _, word := range []string{"PASSWORD", "TOKEN", "SECRET", "DATABASE_URL", "REDIS_URL", "API_KEY"} {
				if strings.Contains(e.Name, word) {
					t.Errorf("%s is a literal value; it must come from a Secret", e.Name)
				}
			}
		}
	}
	for name, key := range map[string]string{"COHORT_DATABASE_URL": "database-url", "COHORT_REDIS_URL": "redis-url"} {
		e, ok := env[name]
		if !ok || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
			e.ValueFrom.SecretKeyRef.Name != "cohort-settings" || e.ValueFrom.SecretKeyRef.Key != key {
			t.Errorf("%s: want a reference to Secret cohort-settings key %s, got %+v", name, key, e)
		}
	}
	if e := env["COHORT_DATABASE_URL"]; e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
		e.ValueFrom.SecretKeyRef.Optional != nil && *e.ValueFrom.SecretKeyRef.Optional {
		t.Error("COHORT_DATABASE_URL is optional: replicas would each fall back to their own SQLite")
	}
	for name, want := range map[string]string{
		"COHORT_PROVISIONER":    "kubernetes",
		"COHORT_KUBE_NAMESPACE": internsNS,
		"COHORT_KUBE_IMAGE":     c.Image,
		"COHORT_DATA_DIR":       "/var/lib/cohort",
		"COHORT_LISTEN":         "0.0.0.0:8080",
		"COHORT_METRICS_LISTEN": "0.0.0.0:9090",
	} {
		if got := env[name].Value; got != want {
			t.Errorf("%s=%q, want %q", name, got, want)
		}
	}
	if e := env["POD_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("POD_NAME (the replica's name in Leases) is not the Pod's name: %+v", e)
	}
	if _, ok := env["COHORT_NO_BOOTSTRAP"]; ok {
		t.Error("COHORT_NO_BOOTSTRAP is set; the docs rely on the first start's bootstrap")
	}

	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts["/var/lib/cohort"]; !ok || volumes[m.Name].EmptyDir == nil {
		t.Error("the data dir is not an emptyDir at /var/lib/cohort")
	}
	// The KEK: a read-only mount of Secret cohort-kek, whole (a subPath
	// would never see a rotated key), at the path COHORT_KEK_FILE names.
	kekFile := env["COHORT_KEK_FILE"].Value
	m, ok := mounts[filepath.Dir(kekFile)]
	if !ok || !m.ReadOnly || m.SubPath != "" {
		t.Fatalf("COHORT_KEK_FILE=%q is not in a whole, read-only mount: %+v", kekFile, m)
	}
	kek := volumes[m.Name].Secret
	if kek == nil || kek.SecretName != "cohort-kek" || len(kek.Items) != 1 ||
		kek.Items[0].Key != "kek.json" || kek.Items[0].Path != filepath.Base(kekFile) {
		t.Errorf("the KEK volume is not Secret cohort-kek's kek.json: %+v", volumes[m.Name])
	}
	// Nothing for others; the group bit is how fsGroup lets 65532 read a
	// file kubelet owns as root.
	if kek != nil && (kek.DefaultMode == nil || *kek.DefaultMode&0o007 != 0) {
		t.Errorf("the KEK's mode lets others read it: %v", kek.DefaultMode)
	}
	if psc == nil || psc.FSGroup == nil || psc.RunAsUser == nil || *psc.FSGroup != *psc.RunAsUser {
		t.Error("without fsGroup the gateway cannot read the root-owned KEK file")
	}
	// A Service named cohort would otherwise inject COHORT_PORT and friends.
	if pod.EnableServiceLinks == nil || *pod.EnableServiceLinks {
		t.Error("enableServiceLinks is on: the cohort Service's variables would share the COHORT_ prefix")
	}

	doc, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	for name := range env {
		if strings.HasPrefix(name, "COHORT_KUBE_") && !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("%s does not explain %s", docsPath, name)
		}
	}

	// The interns' image is one the admission policy lets the gateway run.
	params := find[corev1.ConfigMap](t, ms, "ConfigMap", gatewayNS, "cohort-intern-pods")
	img, allowed := env["COHORT_KUBE_IMAGE"].Value, false
	for _, r := range strings.Split(params.Data["repositories"], ",") {
		r = strings.TrimSpace(r)
		allowed = allowed || r != "" && (img == r || strings.HasPrefix(img, r+":") || strings.HasPrefix(img, r+"@"))
	}
	if !allowed {
		t.Errorf("COHORT_KUBE_IMAGE %q is in none of ConfigMap cohort-intern-pods' repositories %q", img, params.Data["repositories"])
	}

	// The Service selects the gateway and is what COHORT_KUBE_GATEWAY_URL names.
	svc := find[corev1.Service](t, ms, "Service", gatewayNS, "cohort")
	if !subset(svc.Spec.Selector, labels) {
		t.Errorf("Service selector %v does not select the gateway Pods %v", svc.Spec.Selector, labels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8080 || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("Service ports %+v: want 8080 to http", svc.Spec.Ports)
	}
	if got, want := env["COHORT_KUBE_GATEWAY_URL"].Value, fmt.Sprintf("http://%s.%s.svc.cluster.local:%d", svc.Name, svc.Namespace, svc.Spec.Ports[0].Port); got != want {
		t.Errorf("COHORT_KUBE_GATEWAY_URL=%q, want the Service, %q", got, want)
	}

	// The policies select what they are about.
	gw := find[networkingv1.NetworkPolicy](t, ms, "NetworkPolicy", gatewayNS, "cohort-gateway")
	if !subset(gw.Spec.PodSelector.MatchLabels, labels) {
		t.Errorf("cohort-gateway policy selects %v, not the gateway", gw.Spec.PodSelector.MatchLabels)
	}
	deny := find[networkingv1.NetworkPolicy](t, ms, "NetworkPolicy", internsNS, "default-deny")
	if len(deny.Spec.PodSelector.MatchLabels)+len(deny.Spec.PodSelector.MatchExpressions) != 0 ||
		len(deny.Spec.Ingress)+len(deny.Spec.Egress) != 0 || len(deny.Spec.PolicyTypes) != 2 {
		t.Errorf("default-deny does not deny everything both ways: %+v", deny.Spec)
	}
	in := find[networkingv1.NetworkPolicy](t, ms, "NetworkPolicy", internsNS, "cohort-intern")
	internLabels := map[string]string{"app.kubernetes.io/name": "cohort", "app.kubernetes.io/component": "intern", "cohort.dev/intern": "x"}
	if !subset(in.Spec.PodSelector.MatchLabels, internLabels) {
		t.Errorf("cohort-intern policy selects %v, not intern Pods", in.Spec.PodSelector.MatchLabels)
	}
	fromGateway := func(peers []networkingv1.NetworkPolicyPeer) bool {
		return len(peers) == 1 && peers[0].IPBlock == nil && peers[0].NamespaceSelector != nil && peers[0].PodSelector != nil &&
			peers[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == gatewayNS &&
			subset(peers[0].PodSelector.MatchLabels, labels)
	}
	if len(in.Spec.Ingress) != 1 || !fromGateway(in.Spec.Ingress[0].From) ||
		len(in.Spec.Ingress[0].Ports) != 1 || in.Spec.Ingress[0].Ports[0].Port.IntValue() != 7100 {
		t.Errorf("intern ingress is not only the gateway on 7100: %+v", in.Spec.Ingress)
	}
	// Every egress rule of every policy that selects intern Pods names
	// its peers (an empty `to` would be anywhere), and together their
	// address blocks reach the internet's unicast addresses and nothing
	// of the special-purpose registries.
	var blocks []networkingv1.IPBlock
	for _, m := range ms {
		if m.obj.GetKind() != "NetworkPolicy" || m.obj.GetNamespace() != internsNS {
			continue
		}
		np := find[networkingv1.NetworkPolicy](t, ms, "NetworkPolicy", internsNS, m.obj.GetName())
		if len(np.Spec.PodSelector.MatchLabels)+len(np.Spec.PodSelector.MatchExpressions) == 0 {
			continue // default-deny
		}
		if !subset(np.Spec.PodSelector.MatchLabels, internLabels) {
			t.Errorf("policy %s in %s selects %v, not intern Pods", np.Name, internsNS, np.Spec.PodSelector.MatchLabels)
		}
		for i, r := range np.Spec.Egress {
			if len(r.To) == 0 {
				t.Errorf("%s: egress rule %d allows every destination", np.Name, i)
			}
			for _, p := range r.To {
				if p.IPBlock != nil {
					blocks = append(blocks, *p.IPBlock)
				}
			}
		}
	}
	checkInternet(t, blocks)
}

// notInternet is every range an intern must not reach by address: IANA's
// IPv4 and IPv6 Special-Purpose Address Registries (as of 2025), the
// IPv4 and IPv6 multicast ranges, IPv6's deprecated site-local range, and
// the one cloud host address outside them (Azure's WireServer). Typed here
// from the registries, not from the manifest.
var notInternet = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
	"192.0.0.0/24", "192.0.0.0/29", "192.0.0.8/32", "192.0.0.9/32", "192.0.0.10/32", "192.0.0.170/31",
	"192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24", "192.88.99.0/24", "192.168.0.0/16",
	"192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
	"255.255.255.255/32", "224.0.0.0/4", "168.63.129.16/32",
	"::1/128", "::/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64",
	"2001::/23", "2001::/32", "2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:2::/48", "2001:3::/32",
	"2001:4:112::/48", "2001:20::/28", "2001:30::/28", "2001:db8::/32", "2002::/16", "2620:4f:8000::/48",
	"3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
}

// internet is a sample of public model endpoints' kind of address.
var internet = []string{"8.8.8.8", "1.1.1.1", "104.18.33.45", "13.107.42.14", "2606:4700::6810:1", "2a00:1450:4001:82b::200e"}

// allowedBy reports whether blocks let any address of r through: a block
// whose CIDR overlaps r without an except holding all of r.
func allowedBy(blocks []networkingv1.IPBlock, r netip.Prefix) (string, bool) {
	for _, b := range blocks {
		c, err := netip.ParsePrefix(b.CIDR)
		if err != nil || !c.Overlaps(r) {
			continue
		}
		held := false
		for _, e := range b.Except {
			if x, err := netip.ParsePrefix(e); err == nil && x.Bits() <= r.Bits() && x.Contains(r.Addr()) {
				held = true
			}
		}
		if !held {
			return b.CIDR, true
		}
	}
	return "", false
}

func checkInternet(t *testing.T, blocks []networkingv1.IPBlock) {
	t.Helper()
	for _, s := range notInternet {
		if via, ok := allowedBy(blocks, netip.MustParsePrefix(s)); ok {
			t.Errorf("interns may reach %s (through the block %s)", s, via)
		}
	}
	for _, s := range internet {
		a := netip.MustParseAddr(s)
		if _, ok := allowedBy(blocks, netip.PrefixFrom(a, a.BitLen())); !ok {
			t.Errorf("interns may not reach the public address %s", s)
		}
	}
}

// warnings collects the API server's Warning headers: Pod Security's warn
// mode, deprecated APIs and unknown fields all arrive that way, and any of
// them fails the test.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.list
	w.list = nil
	return l
}

// applier applies manifests by server-side apply through the dynamic
// client, as `kubectl apply --server-side` does.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

func (a *applier) resource(t *testing.T, m manifest) dynamic.ResourceInterface {
	t.Helper()
	gvk := m.obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", m, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if m.obj.GetNamespace() == "" {
			// kubectl would put it in the current namespace.
			t.Fatalf("%s: namespaced, but names no namespace", m)
		}
		return a.dyn.Resource(mapping.Resource).Namespace(m.obj.GetNamespace())
	}
	if m.obj.GetNamespace() != "" {
		t.Fatalf("%s: cluster-scoped, but names a namespace", m)
	}
	return a.dyn.Resource(mapping.Resource)
}

func (a *applier) apply(t *testing.T, m manifest, dryRun bool) *unstructured.Unstructured {
	t.Helper()
	body, err := m.obj.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.PatchOptions{FieldManager: "cohort-deploy-test", Force: new(true), FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out, err := a.resource(t, m).Patch(context.Background(), m.obj.GetName(), types.ApplyPatchType, body, opts)
	if err != nil {
		t.Fatalf("%s (dry run %v): %v", m, dryRun, err)
	}
	if w := a.warn.take(); len(w) > 0 {
		t.Errorf("%s (dry run %v): warnings %q", m, dryRun, w)
	}
	return out
}

// contains reports where live lacks or differs from want: the server kept
// every field of the manifest as written (it may add defaults).
func contains(want, live any, path string) []string {
	switch w := want.(type) {
	case map[string]any:
		l, ok := live.(map[string]any)
		if !ok {
			return []string{path + ": not an object"}
		}
		var diffs []string
		for k, v := range w {
			diffs = append(diffs, contains(v, l[k], path+"."+k)...)
		}
		return diffs
	case []any:
		l, ok := live.([]any)
		if !ok || len(l) != len(w) {
			return []string{fmt.Sprintf("%s: %v, want %v", path, live, want)}
		}
		var diffs []string
		for i := range w {
			diffs = append(diffs, contains(w[i], l[i], fmt.Sprintf("%s[%d]", path, i))...)
		}
		return diffs
	case string:
		// Quantities may come back canonical ("1000m" as "1").
		if l, ok := live.(string); ok && l != w {
			if qw, err := resource.ParseQuantity(w); err == nil {
				if ql, err := resource.ParseQuantity(l); err == nil && qw.Cmp(ql) == 0 {
					return nil
				}
			}
		}
	}
	if !reflect.DeepEqual(want, live) {
		return []string{fmt.Sprintf("%s: %v, want %v", path, live, want)}
	}
	return nil
}

func TestManifestsOnAPIServer(t *testing.T) {
	ms := manifests(t)
	cluster := kubetest.Start(t)
	ctx := context.Background()

	warn := &warnings{}
	cfg := rest.CopyConfig(cluster.Config)
	cfg.WarningHandler = warn
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)), warn: warn}

	// A namespaced dry run needs its namespace to exist: those first, for real.
	for _, m := range ms {
		if m.obj.GetKind() == "Namespace" {
			a.apply(t, m, false)
		}
	}
	t.Run("dry-run", func(t *testing.T) {
		for _, m := range ms {
			a.apply(t, m, true)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	t.Run("apply", func(t *testing.T) {
		for _, m := range ms {
			a.apply(t, m, false)
			live, err := a.resource(t, m).Get(ctx, m.obj.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: read back: %v", m, err)
			}
			for _, d := range contains(m.obj.Object, live.Object, "") {
				t.Errorf("%s: %s", m, d)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	// The ServiceAccount admission plugin refuses Pods until the
	// namespace's default ServiceAccount exists; kubetest makes it, as the
	// controller-manager would, a moment after the namespace.
	for _, ns := range []string{gatewayNS, internsNS} {
		testutil.Eventually(t, 30*time.Second, "default ServiceAccount in "+ns, func() bool {
			_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil
		})
	}

	t.Run("docs", func(t *testing.T) {
		examples := docExamples(t)
		if len(examples) == 0 {
			t.Fatalf("no Kubernetes objects among %s's examples", docsPath)
		}
		for _, m := range examples {
			a.apply(t, m, true)
			t.Logf("dry-run applied %s", m)
		}
	})

	t.Run("pod-security", func(t *testing.T) {
		// The gateway's template is admitted as a Pod where restricted is
		// enforced, without a warning.
		dep := find[appsv1.Deployment](t, ms, "Deployment", gatewayNS, "cohort")
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "gateway-template", Labels: dep.Spec.Template.Labels},
			Spec:       dep.Spec.Template.Spec,
		}
		if _, err := client.CoreV1().Pods(gatewayNS).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("the gateway's Pod template is refused in %s: %v", gatewayNS, err)
		}
		if w := warn.take(); len(w) > 0 {
			t.Errorf("the gateway's Pod template: warnings %q", w)
		}
		// And restricted really is enforced in cohort-interns: a Pod
		// without a securityContext is refused.
		loose := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "loose"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/x"}}},
		}
		_, err := client.CoreV1().Pods(internsNS).Create(ctx, loose, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "PodSecurity") {
			t.Errorf("a Pod violating restricted in %s: got %v, want refused by PodSecurity", internsNS, err)
		}
		warn.take()
	})

	t.Run("rbac", func(t *testing.T) {
		imp := rest.CopyConfig(cluster.Config)
		imp.Impersonate = rest.ImpersonationConfig{UserName: gatewaySA}
		sa, err := kubernetes.NewForConfig(imp)
		if err != nil {
			t.Fatal(err)
		}
		can := func(ns, group, res, sub, verb string) bool {
			r, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
				Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: ns, Group: group, Resource: res, Subresource: sub, Verb: verb}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("access review %s %s/%s in %q: %v", verb, res, sub, ns, err)
			}
			return r.Status.Allowed
		}
		// Exactly the Role's verbs in cohort-interns.
		granted := map[[2]string][]string{
			{"", "pods"}:                      {"get", "list", "watch", "create", "delete"},
			{"", "persistentvolumeclaims"}:    {"get", "list", "watch", "create", "delete"},
			{"", "secrets"}:                   {"create", "delete"},
			{"coordination.k8s.io", "leases"}: {"get", "list", "watch", "create", "update", "delete"},
		}
		all := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
		for gr, verbs := range granted {
			for _, v := range all {
				if got, want := can(internsNS, gr[0], gr[1], "", v), slices.Contains(verbs, v); got != want {
					t.Errorf("%s %s in %s: allowed %v, want %v", v, gr[1], internsNS, got, want)
				}
			}
		}
		denied := []struct{ ns, group, res, sub, verb string }{
			{internsNS, "", "pods", "exec", "create"}, // never a shell in an intern
			{internsNS, "", "pods", "log", "get"},
			{internsNS, "", "pods", "attach", "create"},
			{internsNS, "", "pods", "portforward", "create"},
			{internsNS, "", "serviceaccounts", "token", "create"}, // a token for a Pod's account
			{internsNS, "", "configmaps", "", "create"},
			{internsNS, "", "serviceaccounts", "", "create"},
			{internsNS, "rbac.authorization.k8s.io", "roles", "", "create"},
			{internsNS, "rbac.authorization.k8s.io", "rolebindings", "", "create"},
			{gatewayNS, "", "pods", "", "create"},
			{gatewayNS, "", "secrets", "", "get"},
			{gatewayNS, "", "secrets", "", "list"},
			{"default", "", "pods", "", "create"},
			{"kube-system", "", "secrets", "", "list"},
			{"", "", "nodes", "", "list"},
			{"", "", "namespaces", "", "create"},
			{"", "", "persistentvolumes", "", "create"},
			// Nor the fences of its own reach.
			{"", "admissionregistration.k8s.io", "validatingadmissionpolicies", "", "update"},
			{"", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", "delete"},
			{gatewayNS, "", "configmaps", "", "update"},
			{internsNS, "", "configmaps", "", "create"},
			{internsNS, "", "pods", "ephemeralcontainers", "update"},
			{internsNS, "", "pods", "", "update"},
			{internsNS, "", "pods", "", "patch"},
		}
		for _, d := range denied {
			if can(d.ns, d.group, d.res, d.sub, d.verb) {
				t.Errorf("%s %s/%s in %q is allowed", d.verb, d.res, d.sub, d.ns)
			}
		}

		// The same by real requests (dry run): what the provisioner does
		// succeeds, the rest is Forbidden.
		dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		if _, err := sa.CoreV1().Pods(internsNS).Create(ctx, internPod(), dry); err != nil {
			t.Errorf("create an intern Pod: %v", err)
		}
		if _, err := sa.CoreV1().PersistentVolumeClaims(internsNS).Create(ctx, internClaim(), dry); err != nil {
			t.Errorf("create a claim: %v", err)
		}
		if _, err := sa.CoreV1().Secrets(internsNS).Create(ctx, internSecret(), dry); err != nil {
			t.Errorf("create a Secret: %v", err)
		}
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "intern-probe", Labels: internObjectLabels}}
		if _, err := sa.CoordinationV1().Leases(internsNS).Create(ctx, lease, dry); err != nil {
			t.Errorf("create a Lease: %v", err)
		}
		for _, ns := range []string{gatewayNS, "default"} {
			p := internPod()
			p.Namespace = ns
			if _, err := sa.CoreV1().Pods(ns).Create(ctx, p, dry); !apierrors.IsForbidden(err) {
				t.Errorf("create a Pod in %s: got %v, want Forbidden", ns, err)
			}
		}
		if _, err := sa.CoreV1().Secrets(gatewayNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list Secrets in %s: got %v, want Forbidden", gatewayNS, err)
		}
		if _, err := sa.CoreV1().Secrets(internsNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list Secrets in %s: got %v, want Forbidden", internsNS, err)
		}
		if _, err := sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("list nodes: got %v, want Forbidden", err)
		}
	})

	t.Run("runtime-class", func(t *testing.T) {
		testRuntimeClass(t, cluster.Config, client)
	})

	t.Run("reach", func(t *testing.T) {
		testReach(t, cluster.Config, client)
	})

	t.Run("egress", func(t *testing.T) {
		testEgressKnob(t, a, ms)
	})

	// Sorted, so that a failure names the same object first every run.
	names := make([]string, 0, len(ms))
	for _, m := range ms {
		names = append(names, m.String())
	}
	sort.Strings(names)
	t.Logf("validated %d objects: %s", len(names), strings.Join(names, "; "))
}

// With runtimeClass set in the policy's ConfigMap (--kube-runtime-class),
// the gateway's account may create an intern Pod only under that
// RuntimeClass: one without a class or under another is refused (ADR 0982).
func testRuntimeClass(t *testing.T, rc *rest.Config, client kubernetes.Interface) {
	ctx := context.Background()
	for name, handler := range map[string]string{"gvisor": "runsc", "runc": "runc"} {
		c := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}
		if _, err := client.NodeV1().RuntimeClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	setClass := func(class string) {
		cm, err := client.CoreV1().ConfigMaps(gatewayNS).Get(ctx, "cohort-intern-pods", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["runtimeClass"] = class
		if _, err := client.CoreV1().ConfigMaps(gatewayNS).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	imp := rest.CopyConfig(rc)
	imp.Impersonate = rest.ImpersonationConfig{UserName: gatewaySA}
	sa, err := kubernetes.NewForConfig(imp)
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	create := func(class string) error {
		p := internPod()
		if class != "" {
			p.Spec.RuntimeClassName = &class
		}
		_, err := sa.CoreV1().Pods(internsNS).Create(ctx, p, dry)
		return err
	}
	refused := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "RuntimeClass")
	}
	if err := create(""); err != nil {
		t.Fatalf("without runtimeClass in the ConfigMap, a Pod without a class: %v", err)
	}
	setClass("gvisor")
	defer func() {
		setClass("")
		testutil.Eventually(t, 30*time.Second, "a Pod without a class admitted again", func() bool { return create("") == nil })
	}()
	// The policy reads its parameters from an informer: a moment.
	testutil.Eventually(t, 30*time.Second, "a Pod without the RuntimeClass refused", func() bool { return refused(create("")) })
	if err := create("runc"); !refused(err) {
		t.Errorf("a Pod under RuntimeClass runc: got %v, want refused by the policy", err)
	}
	if err := create("gvisor"); err != nil {
		t.Errorf("a Pod under RuntimeClass gvisor: %v", err)
	}
}
