package deploy

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// internObjectLabels are the labels the provisioner gives intern "probe"'s
// objects (internal/provision, internLabels).
var internObjectLabels = map[string]string{
	"app.kubernetes.io/name": "cohort", "app.kubernetes.io/component": "intern", "cohort.dev/intern": "probe"}

// internPod is intern "probe"'s Pod in the provisioner's shape (podFor):
// what the gateway's account must be able to create.
func internPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "intern-probe", Namespace: internsNS, Labels: internObjectLabels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: new(false),
			EnableServiceLinks:           new(false),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(65532)), RunAsGroup: new(int64(65532)),
				FSGroup: new(int64(65532)), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: "intern", Image: "ghcr.io/cohort-dev/cohort:latest", Command: []string{"/cohort"},
				Args: []string{"intern", "--listen", "$(POD_IP):7100", "--data-dir", "/var/lib/cohort/intern"},
				Env: []corev1.EnvVar{
					{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
					{Name: "COHORT_INTERN_SECRET", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "intern-probe-0123abcd"}, Key: "secret"}}},
					{Name: "HOME", Value: "/tmp"},
				},
				Ports: []corev1.ContainerPort{{Name: "daemon", ContainerPort: 7100}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz",
					Port: intstr.FromInt32(7100)}}},
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true), AllowPrivilegeEscalation: new(false), ReadOnlyRootFilesystem: new(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/cohort/intern"}, {Name: "tmp", MountPath: "/tmp"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "intern-probe"}}},
				{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: new(resource.MustParse("1Gi"))}}},
			},
		},
	}
}

func internClaim() *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "intern-probe", Labels: internObjectLabels},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
}

func internSecret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "intern-probe-0123abcd", Labels: internObjectLabels},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"secret": []byte("x")}}
}

// refusedByPolicy reports whether err is the gateway's admission policy
// refusing a request (not RBAC, not Pod Security).
func refusedByPolicy(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy 'cohort-gateway-")
}

// testReach checks, as the gateway's ServiceAccount (impersonated) against
// the real API server with deploy/ applied, that it reaches only what
// Cohort makes: Secrets, Pods, claims and Leases of anyone else in the
// interns' namespace are out of reach, and a Pod can neither run another
// image nor carry another Secret.
func testReach(t *testing.T, admin *rest.Config, adminClient kubernetes.Interface) {
	ctx := context.Background()
	imp := rest.CopyConfig(admin)
	imp.Impersonate = rest.ImpersonationConfig{UserName: gatewaySA}
	sa, err := kubernetes.NewForConfig(imp)
	if err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	dryDelete := metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}

	// The API server loads policies a moment after they are created.
	testutil.Eventually(t, 30*time.Second, "the gateway's admission policies in force", func() bool {
		p := internPod()
		p.Spec.Containers[0].Image = "docker.io/library/busybox:latest"
		_, errPod := sa.CoreV1().Pods(internsNS).Create(ctx, p, dry)
		_, errSecret := sa.CoreV1().Secrets(internsNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-cohorts"}}, dry)
		return refusedByPolicy(errPod) && refusedByPolicy(errSecret)
	})

	// Someone else's objects in the interns' namespace: a pull secret, a
	// Pod, a claim, a Lease.
	regcred := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred"}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry.example.com":{"auth":"dTpw"}}}`)}}
	if _, err := adminClient.CoreV1().Secrets(internsNS).Create(ctx, regcred, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Spec: *internPod().Spec.DeepCopy()}
	other.Spec.Volumes = nil
	other.Spec.Containers[0].VolumeMounts = nil
	other.Spec.Containers[0].Env = nil
	if _, err := adminClient.CoreV1().Pods(internsNS).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := internClaim()
	data.Name, data.Labels = "data", nil
	if _, err := adminClient.CoreV1().PersistentVolumeClaims(internsNS).Create(ctx, data, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := adminClient.CoordinationV1().Leases(internsNS).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("foreign secrets", func(t *testing.T) {
		secrets := sa.CoreV1().Secrets(internsNS)
		if _, err := secrets.Get(ctx, "regcred", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("get regcred: %v, want Forbidden", err)
		}
		if _, err := secrets.Patch(ctx, "regcred", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("patch regcred: %v, want Forbidden", err)
		}
		if _, err := secrets.Update(ctx, regcred, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("update regcred: %v, want Forbidden", err)
		}
		// A DELETE answers with the object: it would read it too.
		if err := secrets.Delete(ctx, "regcred", metav1.DeleteOptions{}); !refusedByPolicy(err) {
			t.Errorf("delete regcred: %v, want refused by the policy", err)
		}
		if _, err := secrets.Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("watch Secrets: %v, want Forbidden", err)
		}
		for name, s := range map[string]*corev1.Secret{
			"another name":               {ObjectMeta: metav1.ObjectMeta{Name: "regcred2"}},
			"an intern's name, no label": {ObjectMeta: metav1.ObjectMeta{Name: "intern-probe-1"}},
			"another intern's name":      {ObjectMeta: metav1.ObjectMeta{Name: "intern-other-1", Labels: internObjectLabels}},
			"a token's type": {ObjectMeta: metav1.ObjectMeta{Name: "intern-probe-token", Labels: internObjectLabels,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: "default"}}, Type: corev1.SecretTypeServiceAccountToken},
		} {
			if _, err := secrets.Create(ctx, s, dry); !refusedByPolicy(err) {
				t.Errorf("create a Secret with %s: %v, want refused by the policy", name, err)
			}
		}
		if got, err := adminClient.CoreV1().Secrets(internsNS).Get(ctx, "regcred", metav1.GetOptions{}); err != nil || len(got.Labels) != 0 {
			t.Errorf("regcred after the gateway's attempts: %v %v", got.Labels, err)
		}
		// Its own, named and labelled as Cohort makes them: created and deleted.
		if _, err := secrets.Create(ctx, internSecret(), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create its own Secret: %v", err)
		}
		if err := secrets.Delete(ctx, internSecret().Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete its own Secret: %v", err)
		}
	})

	t.Run("pods", func(t *testing.T) {
		pods := sa.CoreV1().Pods(internsNS)
		if _, err := pods.Create(ctx, internPod(), dry); err != nil {
			t.Fatalf("an intern Pod of Cohort's shape: %v", err)
		}
		for name, change := range map[string]func(p *corev1.Pod){
			"another image":           func(p *corev1.Pod) { p.Spec.Containers[0].Image = "docker.io/library/busybox:latest" },
			"a look-alike repository": func(p *corev1.Pod) { p.Spec.Containers[0].Image = "ghcr.io/cohort-dev/cohort-tools:latest" },
			"another command":         func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh"} },
			"another subcommand":      func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"serve"} },
			"a Secret volume": func(p *corev1.Pod) {
				p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "regcred"}}})
				p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "s", MountPath: "/s"})
			},
			"a projected Secret": func(p *corev1.Pod) {
				p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "regcred"}}}}}}})
			},
			"a ConfigMap volume": func(p *corev1.Pod) {
				p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}}}})
			},
			"another intern's claim": func(p *corev1.Pod) { p.Spec.Volumes[0].PersistentVolumeClaim.ClaimName = "data" },
			"an unlimited emptyDir":  func(p *corev1.Pod) { p.Spec.Volumes[1].EmptyDir.SizeLimit = nil },
			"a foreign Secret in the environment": func(p *corev1.Pod) {
				p.Spec.Containers[0].Env[1].ValueFrom.SecretKeyRef.Name = "regcred"
			},
			"a Secret's every key in the environment": func(p *corev1.Pod) {
				p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "regcred"}}}}
			},
			"a service-account token": func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = new(true) },
			"a writable root":         func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem = new(false) },
			"an init container": func(p *corev1.Pod) {
				c := *p.Spec.Containers[0].DeepCopy()
				c.Name, c.ReadinessProbe, c.Ports = "init", nil, nil
				p.Spec.InitContainers = []corev1.Container{c}
			},
			"another intern's name": func(p *corev1.Pod) { p.Name = "intern-other" },
			"a chosen node":         func(p *corev1.Pod) { p.Spec.NodeName = "control-plane-1" },
			"a node selector": func(p *corev1.Pod) {
				p.Spec.NodeSelector = map[string]string{"node-role.kubernetes.io/control-plane": ""}
			},
			"a toleration of everything": func(p *corev1.Pod) {
				p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
			},
			"a control-plane toleration": func(p *corev1.Pod) {
				p.Spec.Tolerations = []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
			},
			"no intern label": func(p *corev1.Pod) { p.Labels = map[string]string{"app": "x"} },
		} {
			p := internPod()
			change(p)
			if _, err := pods.Create(ctx, p, dry); !refusedByPolicy(err) {
				t.Errorf("a Pod with %s: %v, want refused by the policy", name, err)
			}
		}
		if err := pods.Delete(ctx, "other", dryDelete); !refusedByPolicy(err) {
			t.Errorf("delete another's Pod: %v, want refused by the policy", err)
		}
	})

	t.Run("claims and leases", func(t *testing.T) {
		claims := sa.CoreV1().PersistentVolumeClaims(internsNS)
		if _, err := claims.Create(ctx, internClaim(), dry); err != nil {
			t.Fatalf("an intern's claim: %v", err)
		}
		for name, change := range map[string]func(c *corev1.PersistentVolumeClaim){
			"a volume": func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv-of-another" },
			"a selector": func(c *corev1.PersistentVolumeClaim) {
				c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
			},
			"a data source": func(c *corev1.PersistentVolumeClaim) {
				c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}
			},
			"another name": func(c *corev1.PersistentVolumeClaim) { c.Name = "data2" },
		} {
			c := internClaim()
			change(c)
			if _, err := claims.Create(ctx, c, dry); !refusedByPolicy(err) {
				t.Errorf("a claim with %s: %v, want refused by the policy", name, err)
			}
		}
		if err := claims.Delete(ctx, "data", dryDelete); !refusedByPolicy(err) {
			t.Errorf("delete another's claim: %v, want refused by the policy", err)
		}
		leases := sa.CoordinationV1().Leases(internsNS)
		if err := leases.Delete(ctx, "other", dryDelete); !refusedByPolicy(err) {
			t.Errorf("delete another's Lease: %v, want refused by the policy", err)
		}
		if _, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}, dry); !refusedByPolicy(err) {
			t.Errorf("create a Lease not an intern's: %v, want refused by the policy", err)
		}
	})
}

// docPatches returns the JSON patches docs/kubernetes.md's kustomization
// examples apply to the named object.
func docPatches(t *testing.T, kind, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, blk := range strings.Split(string(b), "```yaml\n")[1:] {
		blk = blk[:strings.Index(blk, "```")]
		js, err := k8syaml.ToJSON([]byte(blk))
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Kind    string
			Patches []struct {
				Target struct{ Kind, Name string }
				Patch  string
			}
		}
		if err := json.Unmarshal(js, &k); err != nil || k.Kind != "Kustomization" {
			continue
		}
		for _, p := range k.Patches {
			if p.Target.Kind == kind && p.Target.Name == name {
				pj, err := k8syaml.ToJSON([]byte(p.Patch))
				if err != nil {
					t.Fatalf("%s: the patch of %s %s: %v", docsPath, kind, name, err)
				}
				out = append(out, pj)
			}
		}
	}
	return out
}

// testEgressKnob applies the documented patch that blocks the cluster's
// own public addresses to the live policy (as kustomize would: an RFC 6902
// patch), and checks each address it adds lands in the except list of its
// own family and is then unreachable, the rest of the internet still open.
func testEgressKnob(t *testing.T, a *applier, ms []manifest) {
	ctx := context.Background()
	patches := docPatches(t, "NetworkPolicy", "cohort-intern-internet")
	if len(patches) == 0 {
		t.Fatalf("%s shows no patch of NetworkPolicy cohort-intern-internet (the cluster's own addresses)", docsPath)
	}
	var m manifest
	for _, x := range ms {
		if x.obj.GetKind() == "NetworkPolicy" && x.obj.GetName() == "cohort-intern-internet" {
			m = x
		}
	}
	if m.obj == nil {
		t.Fatal("no NetworkPolicy cohort-intern-internet")
	}
	for _, p := range patches {
		var ops []struct {
			Op, Path string
			Value    string
		}
		if err := json.Unmarshal(p, &ops); err != nil {
			t.Fatalf("the documented patch: %v", err)
		}
		out, err := a.resource(t, m).Patch(ctx, m.obj.GetName(), types.JSONPatchType, p, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("the documented patch on the live policy: %v", err)
		}
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(out.Object, &np); err != nil {
			t.Fatal(err)
		}
		var blocks []networkingv1.IPBlock
		for _, r := range np.Spec.Egress {
			for _, peer := range r.To {
				if peer.IPBlock != nil {
					blocks = append(blocks, *peer.IPBlock)
				}
			}
		}
		checkInternet(t, blocks)
		for _, op := range ops {
			pfx, err := netip.ParsePrefix(op.Value)
			if err != nil {
				t.Errorf("the documented patch adds %q: not a CIDR", op.Value)
				continue
			}
			for _, b := range blocks {
				c := netip.MustParsePrefix(b.CIDR)
				if c.Addr().Is4() == pfx.Addr().Is4() && !slices.Contains(b.Except, op.Value) {
					t.Errorf("%s (%s) did not land in the except list of %s: %v", op.Value, op.Path, b.CIDR, b.Except)
				}
			}
		}
		t.Logf("the documented patch: %s", p)
	}
}
