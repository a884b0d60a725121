package kubetest

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A waitError is something a kubelet waits for (a Secret not created yet, the API server
// away); the Pod stays Pending and preparation is retried. Other errors fail the Pod.
type waitError struct{ reason, msg string }

func (e *waitError) Error() string { return e.msg }

func waitFor(reason string, err error) error {
	return &waitError{reason: reason, msg: err.Error()}
}

type plan struct {
	init []*containerPlan
	main *containerPlan
}

// A containerPlan is a container made concrete on this host.
type containerPlan struct {
	name    string
	init    bool
	spec    *corev1.Container
	path    string   // host executable
	argv    []string // spec-level argv after expansion and rewriting
	env     []string // NAME=value, rewritten
	dir     string
	rewrite func(string) string
}

// prepare maps the Pod's volumes to directories and resolves its containers. It is retried
// until it succeeds, so it must be idempotent.
func (n *Node) prepare(p *pod, obj *corev1.Pod) (*plan, error) {
	if len(obj.Spec.Containers) == 0 {
		return nil, fmt.Errorf("no containers")
	}
	vols := map[string]string{}
	for i := range obj.Spec.Volumes {
		v := &obj.Spec.Volumes[i]
		dir, err := n.volume(p, obj, v)
		if err != nil {
			return nil, err
		}
		vols[v.Name] = dir
	}
	pl := &plan{}
	for i := range obj.Spec.InitContainers {
		c, err := n.container(p, obj, &obj.Spec.InitContainers[i], vols)
		if err != nil {
			return nil, err
		}
		c.init = true
		pl.init = append(pl.init, c)
	}
	c, err := n.container(p, obj, &obj.Spec.Containers[0], vols)
	if err != nil {
		return nil, err
	}
	pl.main = c
	return pl, nil
}

func (n *Node) container(p *pod, obj *corev1.Pod, c *corev1.Container, vols map[string]string) (*containerPlan, error) {
	names, vars, err := n.environment(p, obj, c)
	if err != nil {
		return nil, err
	}
	type mount struct{ path, dir string }
	var mounts []mount
	for _, m := range c.VolumeMounts {
		dir, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("container %s: volumeMount %s: no such volume", c.Name, m.Name)
		}
		sub := m.SubPath
		if m.SubPathExpr != "" {
			sub = expand(m.SubPathExpr, vars)
		}
		if sub != "" {
			dir = filepath.Join(dir, sub)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
		}
		if mp := path.Clean(m.MountPath); mp != "/" {
			mounts = append(mounts, mount{mp, dir})
		}
	}
	// Longest first, so /data/cache wins over /data.
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i].path) > len(mounts[j].path) })
	rewrite := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); {
			matched := false
			if i == 0 || !pathChar(s[i-1]) {
				for _, m := range mounts {
					end := i + len(m.path)
					if strings.HasPrefix(s[i:], m.path) && (end == len(s) || s[end] == '/' || !pathChar(s[end])) && !hostPath(s[i:], m.path) {
						b.WriteString(m.dir)
						i, matched = end, true
						break
					}
				}
			}
			if !matched {
				b.WriteByte(s[i])
				i++
			}
		}
		return b.String()
	}

	argv := slices.Concat(c.Command, c.Args)
	key := ""
	if len(c.Command) == 0 { // the image's entrypoint: Binaries by image
		key = c.Image
		argv = slices.Concat([]string{c.Image}, c.Args)
	}
	// Expansion sees the spec's values; rewriting is done once, on the final strings, so a
	// host directory that happens to contain a mount path is not rewritten again.
	for i, a := range argv {
		argv[i] = rewrite(expand(a, vars))
	}
	if key == "" {
		key = argv[0]
	}
	bin, err := n.binary(key)
	if err != nil {
		return nil, fmt.Errorf("container %s: %v", c.Name, err)
	}
	env := make([]string, 0, len(names))
	for _, k := range names {
		env = append(env, k+"="+rewrite(vars[k]))
	}
	dir := filepath.Join(p.dir, "rootfs")
	if c.WorkingDir != "" {
		if dir = rewrite(c.WorkingDir); dir == c.WorkingDir {
			dir = filepath.Join(p.dir, "rootfs", c.WorkingDir)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &containerPlan{name: c.Name, spec: c, path: bin, argv: argv, env: env, dir: dir, rewrite: rewrite}, nil
}

// hostPath reports whether the path at the start of s, below the mount
// path mp, already names a file on this host: the processes run on the host
// without mount namespaces, and a host file the test hands in (an agent
// installed in a checkout under /tmp) must not be taken for a path in the
// Pod's volume. The mount path itself is always the Pod's.
func hostPath(s, mp string) bool {
	end := 0
	for end < len(s) && pathChar(s[end]) {
		end++
	}
	if p := path.Clean(s[:end]); p != mp {
		_, err := os.Stat(p)
		return err == nil
	}
	return false
}

func pathChar(b byte) bool {
	return b == '/' || b == '.' || b == '_' || b == '-' || b == '~' ||
		'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

func (n *Node) binary(cmd string) (string, error) {
	if p, ok := n.Binaries[cmd]; ok {
		return p, nil
	}
	if p, ok := n.Binaries[path.Base(cmd)]; ok {
		return p, nil
	}
	return "", fmt.Errorf("no binary for %q in Node.Binaries", cmd)
}

// expand replaces $(NAME) with vars[NAME] the Kubernetes way: $$ is a literal $, and a
// reference to an undefined name stays as written.
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// environment resolves envFrom, then env (later names win), as the kubelet does. It
// returns the names in order of first definition and their values.
func (n *Node) environment(p *pod, obj *corev1.Pod, c *corev1.Container) ([]string, map[string]string, error) {
	var names []string
	vars := map[string]string{}
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			names = append(names, k)
		}
		vars[k] = v
	}
	for _, from := range c.EnvFrom {
		var data map[string]string
		switch {
		case from.SecretRef != nil:
			s, err := n.secret(p.ctx, from.SecretRef.Name, from.SecretRef.Optional)
			if err != nil {
				return nil, nil, err
			}
			data = map[string]string{}
			for k, v := range s {
				data[k] = string(v)
			}
		case from.ConfigMapRef != nil:
			cm, err := n.configMap(p.ctx, from.ConfigMapRef.Name, from.ConfigMapRef.Optional)
			if err != nil {
				return nil, nil, err
			}
			data = cm
		}
		for _, k := range slices.Sorted(maps.Keys(data)) {
			set(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expand(e.Value, vars))
			continue
		}
		v, ok, err := n.envSource(p, obj, c, e.ValueFrom)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	return names, vars, nil
}

// envSource resolves valueFrom; ok is false for an optional reference to what is missing.
func (n *Node) envSource(p *pod, obj *corev1.Pod, c *corev1.Container, src *corev1.EnvVarSource) (string, bool, error) {
	switch {
	case src.SecretKeyRef != nil:
		r := src.SecretKeyRef
		s, err := n.secret(p.ctx, r.Name, r.Optional)
		if err != nil {
			return "", false, err
		}
		v, ok := s[r.Key]
		if !ok && !isTrue(r.Optional) {
			return "", false, &waitError{"CreateContainerConfigError", fmt.Sprintf("couldn't find key %s in Secret %s/%s", r.Key, n.Namespace, r.Name)}
		}
		return string(v), ok, nil
	case src.ConfigMapKeyRef != nil:
		r := src.ConfigMapKeyRef
		cm, err := n.configMap(p.ctx, r.Name, r.Optional)
		if err != nil {
			return "", false, err
		}
		v, ok := cm[r.Key]
		if !ok && !isTrue(r.Optional) {
			return "", false, &waitError{"CreateContainerConfigError", fmt.Sprintf("couldn't find key %s in ConfigMap %s/%s", r.Key, n.Namespace, r.Name)}
		}
		return v, ok, nil
	case src.FieldRef != nil:
		v, err := fieldValue(obj, p.ip, src.FieldRef.FieldPath)
		return v, err == nil, err
	case src.ResourceFieldRef != nil:
		v, err := resourceValue(obj, c, src.ResourceFieldRef)
		return v, err == nil, err
	}
	return "", false, fmt.Errorf("unsupported valueFrom")
}

func isTrue(b *bool) bool { return b != nil && *b }

func (n *Node) secret(ctx context.Context, name string, optional *bool) (map[string][]byte, error) {
	s, err := n.Client.CoreV1().Secrets(n.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && isTrue(optional):
		return nil, nil
	case apierrors.IsNotFound(err):
		return nil, &waitError{"CreateContainerConfigError", fmt.Sprintf("secret %q not found", name)}
	case err != nil:
		return nil, waitFor("CreateContainerConfigError", err)
	}
	data := maps.Clone(s.Data)
	if data == nil {
		data = map[string][]byte{}
	}
	for k, v := range s.StringData { // not normally stored, but harmless
		data[k] = []byte(v)
	}
	return data, nil
}

func (n *Node) configMap(ctx context.Context, name string, optional *bool) (map[string]string, error) {
	cm, err := n.Client.CoreV1().ConfigMaps(n.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && isTrue(optional):
		return nil, nil
	case apierrors.IsNotFound(err):
		return nil, &waitError{"CreateContainerConfigError", fmt.Sprintf("configmap %q not found", name)}
	case err != nil:
		return nil, waitFor("CreateContainerConfigError", err)
	}
	data := maps.Clone(cm.Data)
	if data == nil {
		data = map[string]string{}
	}
	for k, v := range cm.BinaryData {
		data[k] = string(v)
	}
	return data, nil
}

// fieldValue is the downward API: what a fieldRef names.
func fieldValue(obj *corev1.Pod, ip, field string) (string, error) {
	if k, ok := strings.CutPrefix(field, "metadata.labels['"); ok {
		return obj.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(field, "metadata.annotations['"); ok {
		return obj.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	switch field {
	case "metadata.name":
		return obj.Name, nil
	case "metadata.namespace":
		return obj.Namespace, nil
	case "metadata.uid":
		return string(obj.UID), nil
	case "metadata.labels":
		return formatMap(obj.Labels), nil
	case "metadata.annotations":
		return formatMap(obj.Annotations), nil
	case "spec.nodeName":
		return obj.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return obj.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return "127.0.0.1", nil
	case "status.podIP", "status.podIPs":
		return ip, nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", field)
}

func formatMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return b.String()
}

// resourceValue is a resourceFieldRef: the container's limit or request, by the divisor,
// rounded up; an unset limit is the node's capacity, as on a kubelet.
func resourceValue(obj *corev1.Pod, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" {
		i := slices.IndexFunc(obj.Spec.Containers, func(x corev1.Container) bool { return x.Name == ref.ContainerName })
		if i < 0 {
			return "", fmt.Errorf("resourceFieldRef: no container %q", ref.ContainerName)
		}
		c = &obj.Spec.Containers[i]
	}
	kind, name, _ := strings.Cut(ref.Resource, ".")
	list := c.Resources.Requests
	if kind == "limits" {
		list = c.Resources.Limits
	}
	q, ok := list[corev1.ResourceName(name)]
	if !ok && kind == "limits" {
		switch name {
		case "cpu":
			q = *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI)
		case "memory":
			q = resource.MustParse("8Gi")
		case "ephemeral-storage":
			q = resource.MustParse("100Gi")
		default:
			return "", fmt.Errorf("unsupported resourceFieldRef %q", ref.Resource)
		}
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	if name == "cpu" {
		return fmt.Sprint(int64(math.Ceil(float64(q.MilliValue()) / float64(div.MilliValue())))), nil
	}
	return fmt.Sprint(int64(math.Ceil(float64(q.Value()) / float64(div.Value())))), nil
}

// volume maps a volume to a host directory: a claim's directory is shared by every Pod that
// names the claim and outlives them; the rest is the Pod's own.
func (n *Node) volume(p *pod, obj *corev1.Pod, v *corev1.Volume) (string, error) {
	own := filepath.Join(p.dir, "volumes", v.Name)
	mkdir := func(dir string) (string, error) { return dir, os.MkdirAll(dir, 0o755) }
	switch {
	case v.PersistentVolumeClaim != nil:
		claim := v.PersistentVolumeClaim.ClaimName
		_, err := n.Client.CoreV1().PersistentVolumeClaims(n.Namespace).Get(p.ctx, claim, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return "", &waitError{"ContainerCreating", fmt.Sprintf("persistentvolumeclaim %q not found", claim)}
		} else if err != nil {
			return "", waitFor("ContainerCreating", err)
		}
		return mkdir(filepath.Join(n.Dir, "pvc", claim))
	case v.EmptyDir != nil:
		return mkdir(own)
	case v.HostPath != nil: // kept inside Dir: tests must not write to the real host path
		return mkdir(filepath.Join(n.Dir, "hostpath", v.HostPath.Path))
	}
	// The remaining kinds are files the kubelet writes: rewritten on every attempt.
	if err := os.RemoveAll(own); err != nil {
		return "", err
	}
	if _, err := mkdir(own); err != nil {
		return "", err
	}
	switch {
	case v.Secret != nil:
		s, err := n.secret(p.ctx, v.Secret.SecretName, v.Secret.Optional)
		if err != nil {
			return "", err
		}
		return own, writeItems(own, s, v.Secret.Items, v.Secret.DefaultMode, v.Secret.Optional)
	case v.ConfigMap != nil:
		cm, err := n.configMap(p.ctx, v.ConfigMap.Name, v.ConfigMap.Optional)
		if err != nil {
			return "", err
		}
		return own, writeItems(own, bytesMap(cm), v.ConfigMap.Items, v.ConfigMap.DefaultMode, v.ConfigMap.Optional)
	case v.DownwardAPI != nil:
		return own, n.downward(p, obj, own, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			if err := n.projection(p, obj, own, src, v.Projected.DefaultMode); err != nil {
				return "", err
			}
		}
		return own, nil
	}
	return "", fmt.Errorf("volume %s: unsupported volume type", v.Name)
}

func (n *Node) projection(p *pod, obj *corev1.Pod, dir string, src corev1.VolumeProjection, mode *int32) error {
	switch {
	case src.Secret != nil:
		s, err := n.secret(p.ctx, src.Secret.Name, src.Secret.Optional)
		if err != nil {
			return err
		}
		return writeItems(dir, s, src.Secret.Items, mode, src.Secret.Optional)
	case src.ConfigMap != nil:
		cm, err := n.configMap(p.ctx, src.ConfigMap.Name, src.ConfigMap.Optional)
		if err != nil {
			return err
		}
		return writeItems(dir, bytesMap(cm), src.ConfigMap.Items, mode, src.ConfigMap.Optional)
	case src.DownwardAPI != nil:
		return n.downward(p, obj, dir, src.DownwardAPI.Items, mode)
	case src.ServiceAccountToken != nil:
		// A real token bound to the Pod, from the TokenRequest API, as the kubelet mounts it.
		t := src.ServiceAccountToken
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: t.ExpirationSeconds,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: obj.Name, UID: obj.UID},
		}}
		if t.Audience != "" {
			req.Spec.Audiences = []string{t.Audience}
		}
		sa := obj.Spec.ServiceAccountName
		if sa == "" {
			sa = "default"
		}
		tr, err := n.Client.CoreV1().ServiceAccounts(n.Namespace).CreateToken(p.ctx, sa, req, metav1.CreateOptions{})
		if err != nil {
			return waitFor("ContainerCreating", err)
		}
		return writeFile(dir, t.Path, []byte(tr.Status.Token), mode)
	}
	return nil // clusterTrustBundle, podCertificate: not written
}

func (n *Node) downward(p *pod, obj *corev1.Pod, dir string, items []corev1.DownwardAPIVolumeFile, mode *int32) error {
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = fieldValue(obj, p.ip, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = resourceValue(obj, &obj.Spec.Containers[0], it.ResourceFieldRef)
		}
		if err != nil {
			return err
		}
		m := mode
		if it.Mode != nil {
			m = it.Mode
		}
		if err := writeFile(dir, it.Path, []byte(v), m); err != nil {
			return err
		}
	}
	return nil
}

func bytesMap(m map[string]string) map[string][]byte {
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = []byte(v)
	}
	return out
}

// writeItems writes data's keys as files (all, or the items' selection and paths).
func writeItems(dir string, data map[string][]byte, items []corev1.KeyToPath, mode *int32, optional *bool) error {
	if len(items) == 0 {
		for k, v := range data {
			if err := writeFile(dir, k, v, mode); err != nil {
				return err
			}
		}
		return nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if isTrue(optional) || data == nil {
				continue
			}
			return &waitError{"ContainerCreating", fmt.Sprintf("key %s not found", it.Key)}
		}
		m := mode
		if it.Mode != nil {
			m = it.Mode
		}
		if err := writeFile(dir, it.Path, v, m); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(dir, name string, data []byte, mode *int32) error {
	perm := os.FileMode(0o644)
	if mode != nil {
		perm = os.FileMode(*mode) & 0o777
	}
	p := filepath.Join(dir, filepath.Clean("/"+name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p, data, perm); err != nil {
		return err
	}
	return os.Chmod(p, perm) // WriteFile's perm is masked by umask
}
