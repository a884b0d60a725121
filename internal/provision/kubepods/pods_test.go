package kubepods

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/provision"
)

// An intern Pod's ephemeral volumes carry the configured size limit, and
// each Pod takes its daemon secret from a Secret named for it alone.
func TestPodForLimitsAndNamesItsSecret(t *testing.T) {
	p := &Backend{Config: Config{Image: "ghcr.io/cohort-dev/cohort:test", TmpSize: resource.MustParse("64Mi")}}
	in := provision.Spec{ID: "0f0e0d0c-0000-4000-8000-000000000001", Model: "m"}
	pod := p.podFor(in, provision.SecretTag("wrapped-1"), provision.AgentRun{})
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			continue
		}
		if v.EmptyDir == nil || v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(resource.MustParse("64Mi")) != 0 {
			t.Errorf("volume %s: %+v, want an emptyDir limited to 64Mi", v.Name, v.VolumeSource)
		}
	}
	name := podSecret(pod)
	if !strings.HasPrefix(name, podName(in.ID)+"-") || name != secretName(in.ID, pod.Annotations[annSecret]) {
		t.Errorf("the Pod's Secret %q is not named for the intern and this Pod", name)
	}
	if other := podSecret(p.podFor(in, provision.SecretTag("wrapped-2"), provision.AgentRun{})); other == name {
		t.Errorf("two Pods of two daemon secrets share the Secret %q", name)
	}
}

// An intern's own memory, CPUs and /tmp size lower its Pod's (a request
// above the lowered limit with it), never raise them; the Pod's annotation
// names them, so a change replaces the Pod.
func TestPodForInternLimits(t *testing.T) {
	q := resource.MustParse
	cfg := Config{Image: "i", TmpSize: q("1Gi"),
		Requests: corev1.ResourceList{corev1.ResourceMemory: q("1Gi"), corev1.ResourceCPU: q("500m")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: q("4Gi"), corev1.ResourceCPU: q("2")}}
	p := &Backend{Config: cfg}
	in := provision.Spec{ID: "0f0e0d0c-0000-4000-8000-000000000002", Model: "m"}
	plain := p.podFor(in, "t", provision.AgentRun{})
	if _, ok := plain.Annotations[annLimits]; ok {
		t.Errorf("a Pod of an intern without limits of its own is annotated: %v", plain.Annotations)
	}
	in.Limits = config.InternLimits{Memory: 512 << 20, CPUs: 0.25, Tmpfs: 64 << 20, Processes: 100}
	pod := p.podFor(in, "t", provision.AgentRun{})
	r := pod.Spec.Containers[0].Resources
	for _, c := range []struct {
		what      string
		got, want resource.Quantity
	}{
		{"memory limit", r.Limits[corev1.ResourceMemory], q("512Mi")},
		{"memory request", r.Requests[corev1.ResourceMemory], q("512Mi")},
		{"cpu limit", r.Limits[corev1.ResourceCPU], q("250m")},
		{"cpu request", r.Requests[corev1.ResourceCPU], q("250m")},
	} {
		if c.got.Cmp(c.want) != 0 {
			t.Errorf("%s %s, want %s", c.what, c.got.String(), c.want.String())
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.SizeLimit.Cmp(q("64Mi")) != 0 {
			t.Errorf("/tmp of %s, want 64Mi", v.EmptyDir.SizeLimit.String())
		}
	}
	if got := pod.Annotations[annLimits]; got != "memory=536870912,cpus=0.25,tmpfs=67108864" {
		t.Errorf("annotation %q", got)
	}
	if p.Config.Limits.Memory().Cmp(q("4Gi")) != 0 || p.Config.Requests.Memory().Cmp(q("1Gi")) != 0 {
		t.Errorf("the operator's resources were changed: %v %v", p.Config.Limits, p.Config.Requests)
	}
	// Above the operator's: the operator's hold.
	in.Limits = config.InternLimits{Memory: 8 << 30, CPUs: 3}
	r = p.podFor(in, "t", provision.AgentRun{}).Spec.Containers[0].Resources
	if r.Limits.Memory().Cmp(q("4Gi")) != 0 || r.Limits.Cpu().Cmp(q("2")) != 0 {
		t.Errorf("limits above the operator's raised the Pod's: %v", r.Limits)
	}
}

// --kube-runtime-class puts every intern Pod under that RuntimeClass, and a
// Pod under another (or none) is not the one this gateway would make.
func TestPodForRuntimeClass(t *testing.T) {
	in := provision.Spec{ID: "0f0e0d0c-0000-4000-8000-000000000003", Model: "m"}
	plain := (&Backend{Config: Config{Image: "i"}}).podFor(in, "t", provision.AgentRun{})
	if plain.Spec.RuntimeClassName != nil {
		t.Errorf("without --kube-runtime-class a Pod names RuntimeClass %q", *plain.Spec.RuntimeClassName)
	}
	b := &Backend{Config: Config{Image: "i", RuntimeClass: "gvisor"}}
	pod := b.podFor(in, "t", provision.AgentRun{})
	if c := pod.Spec.RuntimeClassName; c == nil || *c != "gvisor" {
		t.Fatalf("RuntimeClassName %v, want gvisor", c)
	}
	if b.podRunsOf(pod) != b.Fingerprint(in) {
		t.Errorf("a Pod this gateway made does not run what it would make")
	}
	if b.podRunsOf(plain) == b.Fingerprint(in) {
		t.Errorf("a Pod without the RuntimeClass is taken for one with it (it would be adopted, not replaced)")
	}
}
