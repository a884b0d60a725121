package kubetest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cohort-dev/cohort/internal/testing/kubetest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

const ns = "kt"

func TestClusterAndNode(t *testing.T) {
	// The program is built while the cluster starts.
	bin := filepath.Join(t.TempDir(), "podprog")
	built := make(chan error, 1)
	go func() {
		out, err := exec.Command("go", "build", "-o", bin, "./testdata/podprog").CombinedOutput()
		if err != nil {
			err = &buildError{err, out}
		}
		built <- err
	}()
	c := kubetest.Start(t)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	c.Namespace(t, ns)
	ctx := t.Context()
	pods := c.Client.CoreV1().Pods(ns)

	dir := t.TempDir()
	node := &kubetest.Node{Client: c.Client, Namespace: ns, Binaries: map[string]string{"/podprog": bin}, Dir: dir, Log: t.Logf}
	node.Start(t)

	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The Pod comes before its Secret: the node waits, as a kubelet does.
	one := create(t, c.Client, workload("one"))
	waitPod(t, c.Client, "one", "waiting for the Secret", func(p *corev1.Pod) bool {
		s := p.Status.ContainerStatuses
		return len(s) == 1 && s[0].State.Waiting != nil && s[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	if _, err := c.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "s"},
		StringData: map[string]string{"token": "s3cret"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPod(t, c.Client, "one", "Ready", ready)
	ip := node.PodIP("one")
	if p.Status.PodIP != ip || p.Spec.NodeName != kubetest.DefaultNodeName || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("podIP %q (node says %q), node %q, phase %s", p.Status.PodIP, ip, p.Spec.NodeName, p.Status.Phase)
	}
	if got := get(t, "http://"+ip+":8080/env?name=TOKEN"); got != "s3cret" {
		t.Errorf("TOKEN in the process = %q", got)
	}
	if spec, _ := json.Marshal(p); strings.Contains(string(spec), "s3cret") {
		t.Error("the secret value is in the Pod object")
	}
	st := node.Started()
	if len(st) != 1 || st[0].Pod != "one" || st[0].Getenv("TOKEN") != "s3cret" {
		t.Fatalf("Started = %+v", st)
	}
	state := filepath.Join(dir, "pvc", "data", "state.txt")
	if want := []string{"/podprog", "--listen=" + ip + ":8080", "--state=" + state}; !slices.Equal(st[0].Argv, want) {
		t.Errorf("argv %q, want %q", st[0].Argv, want)
	}
	if b, err := os.ReadFile(state); err != nil || string(b) != "written by one" {
		t.Errorf("state file: %q, %v", b, err)
	}
	// The ServiceAccount admission plugin's token volume got a real token.
	i := slices.IndexFunc(one.Spec.Volumes, func(v corev1.Volume) bool { return strings.HasPrefix(v.Name, "kube-api-access-") })
	if i < 0 {
		t.Fatalf("no service account token volume in %+v", one.Spec.Volumes)
	}
	if tok, err := os.ReadFile(filepath.Join(dir, "pods", string(one.UID), "volumes", one.Spec.Volumes[i].Name, "token")); err != nil || len(tok) < 100 {
		t.Errorf("service account token: %d bytes, %v", len(tok), err)
	}

	// Deletion is graceful: SIGTERM, then the node confirms and the object goes.
	if err := pods.Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c.Client, "one")
	if n := node.Running(); n != 0 {
		t.Errorf("%d processes still running", n)
	}
	if _, err := os.Stat(filepath.Join(dir, "pods", string(one.UID))); !os.IsNotExist(err) {
		t.Errorf("the Pod's own directory outlived it: %v", err)
	}

	// The API server goes away and comes back; the node carries on.
	c.StopAPIServer(t)
	if _, err := pods.List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("the API server answered while stopped")
	}
	c.StartAPIServer(t)
	create(t, c.Client, workload("two"))
	waitPod(t, c.Client, "two", "Ready", ready)
	if got := get(t, "http://"+node.PodIP("two")+":8080/state"); got != "written by one" {
		t.Errorf("state seen by the second Pod = %q", got)
	}
	if node.PodIP("two") == ip {
		t.Error("two Pods share an address")
	}

	// What cannot run fails the Pod; an exit code ends it.
	bad := workload("bad")
	bad.Spec.Containers[0].Command = []string{"/nonexistent"}
	create(t, c.Client, bad)
	p = waitPod(t, c.Client, "bad", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if !strings.Contains(p.Status.Message, "/nonexistent") {
		t.Errorf("message %q", p.Status.Message)
	}
	exit := workload("exit")
	exit.Spec.Containers[0].Args = []string{"--exit=3"}
	create(t, c.Client, exit)
	p = waitPod(t, c.Client, "exit", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if s := p.Status.ContainerStatuses; len(s) != 1 || s[0].State.Terminated == nil || s[0].State.Terminated.ExitCode != 3 {
		t.Errorf("container statuses %+v", s)
	}
}

func TestRestrictedUser(t *testing.T) {
	c := kubetest.Start(t)
	c.Namespace(t, ns)
	ctx := t.Context()
	user, err := kubernetes.NewForConfig(c.ConfigFor(t, "cohort-gateway"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := user.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list without a role: %v", err)
	}
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pods"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "cohort-gateway"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The authorizer sees the binding through its informers: a moment later.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := user.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list with the role: %v", err)
		}
	}
	if _, err := user.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("secrets: %v", err)
	}
}

func workload(name string) *corev1.Pod {
	fieldRef := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   "podprog:test",
				Command: []string{"/podprog"},
				Args:    []string{"--listen=$(POD_IP):8080", "--state=/data/state.txt"},
				Env: []corev1.EnvVar{
					{Name: "POD_IP", ValueFrom: fieldRef("status.podIP")},
					{Name: "POD_NAME", ValueFrom: fieldRef("metadata.name")},
					{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
						LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "token"}}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}},
		},
	}
}

func create(t *testing.T, c kubernetes.Interface, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitPod(t *testing.T, c kubernetes.Interface, name, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		p, err := c.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err == nil && ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s not %s: %v; status %+v", name, what, err, p.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitGone(t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := c.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still there: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + ": " + string(e.out) }
