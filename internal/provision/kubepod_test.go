package provision

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cohort-dev/cohort/internal/store"
)

// An intern Pod's ephemeral volumes carry the configured size limit, and
// each Pod takes its daemon secret from a Secret named for it alone.
func TestPodForLimitsAndNamesItsSecret(t *testing.T) {
	p := &Provisioner{kube: &kubeFleet{cfg: &KubeConfig{Image: "ghcr.io/cohort-dev/cohort:test", TmpSize: resource.MustParse("64Mi")}}}
	in := &store.Intern{ID: "0f0e0d0c-0000-4000-8000-000000000001", Model: "m", DaemonSecret: "wrapped-1"}
	pod := p.podFor(in, agentRun{})
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
	in.DaemonSecret = "wrapped-2"
	if other := podSecret(p.podFor(in, agentRun{})); other == name {
		t.Errorf("two Pods of two daemon secrets share the Secret %q", name)
	}
}
