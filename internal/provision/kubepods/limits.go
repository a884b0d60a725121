package kubepods

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/cohort-dev/cohort/internal/config"
)

// annLimits records the intern's own limits a Pod was made with: a Pod of
// other limits is replaced, as one of another model is. Absent for an
// intern without any, so Pods made before it existed stay current.
const annLimits = "cohort.dev/limits"

// kubeLimits is annLimits' value: the intern's own limits that a Pod
// carries (memory, CPUs, /tmp's size), "" when it has none of them. The
// others (processes, CPU weight, disk) have no per-Pod equivalent the
// provisioner sets (ADR 0024).
func kubeLimits(l config.InternLimits) string {
	var parts []string
	if l.Memory > 0 {
		parts = append(parts, fmt.Sprintf("memory=%d", l.Memory))
	}
	if l.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("cpus=%g", l.CPUs))
	}
	if l.Tmpfs > 0 {
		parts = append(parts, fmt.Sprintf("tmpfs=%d", l.Tmpfs))
	}
	return strings.Join(parts, ",")
}

// podResources is the operator's Pod resources with the intern's own
// memory and CPUs where they are lower (or the operator set none): a
// request above the lowered limit comes down to it, which Kubernetes
// requires.
func podResources(requests, limits corev1.ResourceList, own config.InternLimits) corev1.ResourceRequirements {
	req, lim := requests.DeepCopy(), limits.DeepCopy()
	lower := func(name corev1.ResourceName, q resource.Quantity) {
		if cur, ok := lim[name]; !ok || q.Cmp(cur) < 0 {
			if lim == nil {
				lim = corev1.ResourceList{}
			}
			lim[name] = q
		}
		if cur, ok := req[name]; ok && cur.Cmp(lim[name]) > 0 {
			req[name] = lim[name]
		}
	}
	if own.Memory > 0 {
		lower(corev1.ResourceMemory, *resource.NewQuantity(own.Memory, resource.BinarySI))
	}
	if own.CPUs > 0 {
		lower(corev1.ResourceCPU, *resource.NewMilliQuantity(int64(own.CPUs*1000+0.5), resource.DecimalSI))
	}
	return corev1.ResourceRequirements{Requests: req, Limits: lim}
}

// podTmpSize is the size of the Pod's /tmp: the operator's, or the
// intern's own where lower.
func podTmpSize(op resource.Quantity, own config.InternLimits) resource.Quantity {
	if own.Tmpfs > 0 {
		if q := *resource.NewQuantity(own.Tmpfs, resource.BinarySI); op.IsZero() || q.Cmp(op) < 0 {
			return q
		}
	}
	return op
}
