package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/cohort-dev/cohort/internal/agents"
	"github.com/cohort-dev/cohort/internal/builtinagent/agenttest"
	"github.com/cohort-dev/cohort/internal/modelserver"
	"github.com/cohort-dev/cohort/internal/testing/kubetest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// kubeNS is the interns' namespace of these tests (serve's default).
const kubeNS = "cohort-interns"

// kubeFleet is a test cluster with a node played by the test, and two
// gateway replicas on one PostgreSQL database provisioning interns as Pods.
type kubeFleet struct {
	kc   *kubetest.Cluster
	node *kubetest.Node
	c    *cluster
	a, b *proc
	args []string
}

func newKubeFleet(t testing.TB, extra ...string) *kubeFleet {
	t.Helper()
	return newKubeFleetEnv(t, nil, extra...)
}

// newKubeFleetEnv is newKubeFleet with environment for both gateways.
func newKubeFleetEnv(t testing.TB, env []string, extra ...string) *kubeFleet {
	t.Helper()
	kc := kubetest.Start(t)
	kc.Namespace(t, kubeNS)
	kc.Namespace(t, "cohort")
	// The gateways act as deploy/'s ServiceAccount does, under its Role and
	// admission policies: Cohort's own objects must pass them.
	applyDeploy(t, kc, "namespaces.yaml", "gateway-rbac.yaml", "gateway-admission.yaml")
	gatewayKubeconfig := kc.KubeconfigFor(t, "system:serviceaccount:cohort:cohort", "system:serviceaccounts", "system:serviceaccounts:cohort")
	node := &kubetest.Node{Client: kc.Client, Namespace: kubeNS, Dir: t.TempDir(),
		Binaries: map[string]string{"/cohort": cohortBin}, Log: t.Logf}
	node.Start(t)
	// The Pods reach the gateway as they would its Service: gateway A's
	// address, chosen before it starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	f := &kubeFleet{kc: kc, node: node}
	f.args = append([]string{"--provisioner", "kubernetes", "--kube-config", gatewayKubeconfig, "--kube-image", "ghcr.io/cohort-dev/cohort:test",
		"--kube-gateway-url", "http://" + addr}, extra...)
	f.c = &cluster{dataDir: t.TempDir()}
	f.c.dbArgs = []string{"--data-dir", f.c.dataDir, "--database-url", storetest.PostgresURL(t)}
	f.a = f.c.GatewayEnv(t, env, append([]string{"--listen", addr}, f.args...)...)
	f.c.load(t)
	f.b = f.c.GatewayEnv(t, env, append([]string{"--no-bootstrap"}, f.args...)...)
	return f
}

// applyDeploy creates the objects of files in deploy/ (namespaces: their
// labels) on the test cluster, as its admin, and waits until the
// admission policies among them are in force.
func applyDeploy(t testing.TB, kc *kubetest.Cluster, files ...string) {
	t.Helper()
	ctx := context.Background()
	policies := false
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
			if err != nil {
				t.Fatalf("deploy/%s: %v", f, err)
			}
			c := kc.Client
			switch o := obj.(type) {
			case *corev1.Namespace:
				ns, err := c.CoreV1().Namespaces().Get(ctx, o.Name, metav1.GetOptions{})
				if err == nil {
					ns.Labels = o.Labels
					_, err = c.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
				}
				if err != nil {
					t.Fatal(err)
				}
			case *rbacv1.Role:
				_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.RoleBinding:
				_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			case *corev1.ConfigMap:
				_, err = c.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			case *admissionv1.ValidatingAdmissionPolicy:
				policies = true
				_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
			case *admissionv1.ValidatingAdmissionPolicyBinding:
				_, err = c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
			default:
				t.Fatalf("deploy/%s: %T not expected here", f, obj)
			}
			if err != nil {
				t.Fatalf("deploy/%s: %v", f, err)
			}
		}
	}
	if !policies {
		return
	}
	// The API server loads policies a moment after they are created.
	gw, err := kubernetes.NewForConfig(kc.ConfigFor(t, "system:serviceaccount:cohort:cohort"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the gateway's admission policies in force", func() bool {
		_, err := gw.CoreV1().Secrets(kubeNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "not-cohorts"}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy")
	})
}

// podSecret is the Secret a Pod's daemon takes its secret from.
func podSecret(t testing.TB, pod *corev1.Pod) string {
	t.Helper()
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == "COHORT_INTERN_SECRET" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name
		}
	}
	t.Fatalf("pod %s takes COHORT_INTERN_SECRET from no Secret", pod.Name)
	return ""
}

func (f *kubeFleet) pod(t testing.TB, id string) (*corev1.Pod, bool) {
	t.Helper()
	p, err := f.kc.Client.CoreV1().Pods(kubeNS).Get(context.Background(), "intern-"+id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, true
}

func (f *kubeFleet) exists(t testing.TB, what, name string) bool {
	t.Helper()
	ctx := context.Background()
	var err error
	switch what {
	case "claim":
		_, err = f.kc.Client.CoreV1().PersistentVolumeClaims(kubeNS).Get(ctx, name, metav1.GetOptions{})
	case "secret":
		_, err = f.kc.Client.CoreV1().Secrets(kubeNS).Get(ctx, name, metav1.GetOptions{})
	case "lease":
		_, err = f.kc.Client.CoordinationV1().Leases(kubeNS).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// podsStarted counts the Pods of an intern the node has run.
func (f *kubeFleet) podsStarted(id string) int {
	n := 0
	for _, s := range f.node.Started() {
		if s.Pod == "intern-"+id {
			n++
		}
	}
	return n
}

func (f *kubeFleet) state(t testing.TB, id string) string {
	t.Helper()
	return f.c.Admin(t, "intern", "get", "--org", f.c.Org, "--id", id)["state"].(string)
}

// turn streams one turn through gw and checks it answered.
func turnOK(t testing.TB, gw *proc, key, id, prompt string) *stream {
	t.Helper()
	s := readAll(t, chat(t, gw, key, id, user(prompt)))
	if s.Finish != "stop" || s.Text == "" {
		t.Fatalf("turn %q through %s: %q %q %v", prompt, gw.URL, s.Finish, s.Text, s.Chunks)
	}
	return s
}

// An intern's life on a cluster: one Pod while awake, reached through
// either replica; asleep, no Pod and the claim kept; woken by both
// replicas at once, one Pod; the API server away, a refusal in the spec's
// shape and recovery when it returns; deleted, nothing left.
func TestKubernetesInterns(t *testing.T) {
	stray := strayDescriptor(t)
	f := newKubeFleet(t, "--intern-idle-timeout", "3s")
	id, c := f.c.Demo, f.c

	s := turnOK(t, f.a, c.WK, id, "$ echo through-a > note.txt; cat note.txt")
	if !strings.Contains(s.Text, "through-a") {
		t.Fatalf("self-drive turn in the pod: %q", s.Text)
	}
	turnOK(t, f.b, c.WK, id, "hello through b")
	if n := f.podsStarted(id); n != 1 {
		t.Fatalf("pods started for one awake intern through two replicas: %d", n)
	}

	// The Pod's daemon seals what its container inherited (the node's
	// own descriptors here; a runtime's elsewhere): its agent and the
	// agent's commands hold 0-2 only.
	t.Run("descriptors", func(t *testing.T) {
		daemonPid := func() int {
			p, err := f.kc.Client.CoreV1().Pods(kubeNS).Get(context.Background(), "intern-"+id, metav1.GetOptions{})
			if err != nil || len(p.Status.ContainerStatuses) == 0 {
				return 0
			}
			return atoi(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "kubetest://"))
		}
		checkFDsDuringOf(t, daemonPid, "pod", "sleep", stray, true, func() {
			turnOK(t, f.a, c.WK, id, "$ sleep 3")
		})
	})

	var secretName string
	t.Run("pod spec", func(t *testing.T) {
		pod, ok := f.pod(t, id)
		if !ok {
			t.Fatal("no pod")
		}
		sp := pod.Spec
		if sp.AutomountServiceAccountToken == nil || *sp.AutomountServiceAccountToken {
			t.Error("the service-account token is mounted")
		}
		for _, v := range sp.Volumes {
			if v.Projected != nil || (v.Secret != nil) {
				t.Errorf("volume %s mounts a token or secret", v.Name)
			}
			if v.EmptyDir != nil && (v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.Cmp(resource.MustParse("1Gi")) != 0) {
				t.Errorf("emptyDir %s: size limit %v, want the default 1Gi", v.Name, v.EmptyDir.SizeLimit)
			}
		}
		ct := sp.Containers[0]
		sc := ct.SecurityContext
		if sp.SecurityContext.RunAsNonRoot == nil || !*sp.SecurityContext.RunAsNonRoot || sp.SecurityContext.RunAsUser == nil || *sp.SecurityContext.RunAsUser == 0 {
			t.Error("the pod may run as root")
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container security context: %+v", sc)
		}
		if ct.Resources.Limits.Memory().IsZero() || ct.Resources.Requests.Cpu().IsZero() {
			t.Errorf("resources: %+v", ct.Resources)
		}
		// The daemon got its secret from the Secret, and no part of the
		// Pod's spec holds it.
		var secret string
		for _, st := range f.node.Started() {
			if st.Pod == pod.Name {
				secret = st.Getenv("COHORT_INTERN_SECRET")
			}
		}
		if len(secret) < 32 {
			t.Fatalf("the daemon's secret from the Secret: %q", secret)
		}
		raw, _ := json.Marshal(pod)
		if strings.Contains(string(raw), secret) {
			t.Error("the daemon secret is in the pod's spec")
		}
		secretName = podSecret(t, pod)
		if !strings.HasPrefix(secretName, "intern-"+id+"-") {
			t.Errorf("the Pod's Secret %q is not named as the intern's", secretName)
		}
		sec, err := f.kc.Client.CoreV1().Secrets(kubeNS).Get(context.Background(), secretName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != pod.UID {
			t.Errorf("the Secret is not owned by its pod: %+v", sec.OwnerReferences)
		}
	})

	claimDir := filepath.Join(f.node.Dir, "pvc", "intern-"+id)
	if entries, err := os.ReadDir(claimDir); err != nil || len(entries) == 0 {
		t.Fatalf("the intern's state on its claim (%s): %v %v", claimDir, entries, err)
	}

	// Idle past the timeout: the Pod and its Secret go, the claim stays.
	testutil.Eventually(t, wait, "the idle intern sleeps", func() bool { return f.state(t, id) == "sleeping" })
	testutil.Eventually(t, wait, "the sleeping intern's pod is deleted", func() bool {
		_, ok := f.pod(t, id)
		return !ok && f.node.Running() == 0
	})
	if !f.exists(t, "claim", "intern-"+id) || f.exists(t, "secret", secretName) {
		t.Fatal("asleep: the claim must stay and the Secret go")
	}

	// Both replicas wake it at once: one Pod, and both turns answered;
	// the new Pod has a Secret of its own.
	var wg sync.WaitGroup
	for i, gw := range []*proc{f.a, f.b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			turnOK(t, gw, c.WK, id, fmt.Sprintf("$ cat note.txt; echo woken-%d", i))
		}()
	}
	wg.Wait()
	if n := f.podsStarted(id); n != 2 {
		t.Fatalf("pods started after one wake by two replicas: %d, want 2 in all", n)
	}
	if pod, ok := f.pod(t, id); !ok || podSecret(t, pod) == secretName {
		t.Fatalf("the woken intern's pod (%v) shares the Secret %s of the one before", ok, secretName)
	} else {
		secretName = podSecret(t, pod)
	}
	s = turnOK(t, f.a, c.WK, id, "$ cat note.txt")
	if !strings.Contains(s.Text, "through-a") {
		t.Fatalf("the claim's files after the wake: %q", s.Text)
	}

	// The API server away: a sleeping intern cannot be woken, and the
	// caller is told so in the spec's shape; once it is back, it can.
	testutil.Eventually(t, wait, "the intern sleeps again", func() bool {
		_, ok := f.pod(t, id)
		return f.state(t, id) == "sleeping" && !ok
	})
	f.kc.StopAPIServer(t)
	refusal(t, chat(t, f.b, c.WK, id, user("are you there")), 502, "intern_unreachable")
	f.kc.StartAPIServer(t)
	testutil.Eventually(t, wait, "a turn after the API server returns", func() bool {
		res := chat(t, f.b, c.WK, id, user("back again"))
		if res.StatusCode != 200 {
			res.Body.Close()
			return false
		}
		return readAll(t, res).Finish == "stop"
	})

	// Deleted: the Pod, the Secret, the claim and the Lease all go.
	if pod, ok := f.pod(t, id); ok {
		secretName = podSecret(t, pod)
	}
	c.Admin(t, "intern", "delete", "--org", c.Org, "--id", id)
	testutil.Eventually(t, wait, "the deleted intern's objects are removed", func() bool {
		_, ok := f.pod(t, id)
		return !ok && !f.exists(t, "claim", "intern-"+id) && !f.exists(t, "secret", secretName) && !f.exists(t, "lease", "intern-"+id)
	})
}

// Pods outlive the gateways: a run paused before both replicas restarted
// resumes after. A replica that dies mid-wake leaves its Lease and a Pod
// perhaps without its Secret: once the Lease expires, the other replica
// finishes the wake.
func TestKubernetesReplicaDiesMidWake(t *testing.T) {
	f := newKubeFleet(t)
	id, c := f.c.Demo, f.c
	turnOK(t, f.a, c.WK, id, "hello")
	p := readAll(t, chat(t, f.a, c.WK, id, user("$ echo survives-restarts", `"approval_mode":"manual"`)))
	if p.Finish != "tool_calls" {
		t.Fatalf("pause: %q", p.Finish)
	}
	f.a.Stop(t)
	f.b.Stop(t)
	f.a = f.c.Gateway(t, append([]string{"--no-bootstrap"}, f.args...)...)
	r := readAll(t, chat(t, f.a, c.WK, id, p.answer("allow_once")))
	if r.Finish != "stop" || !strings.Contains(r.Text, "survives-restarts") {
		t.Fatalf("resume after both replicas restarted: %q %q", r.Finish, r.Text)
	}
	if n := f.podsStarted(id); n != 1 {
		t.Fatalf("pods started: %d", n)
	}

	// A dies just after creating the Pod of a resumed intern, holding its
	// Lease; B finishes the wake with that same Pod once the Lease expires.
	f.b.Stop(t)
	c.Admin(t, "intern", "suspend", "--org", c.Org, "--id", id)
	testutil.Eventually(t, wait, "the suspended intern's pod is deleted", func() bool {
		_, ok := f.pod(t, id)
		return !ok
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	w, err := f.kc.Client.CoreV1().Pods(kubeNS).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=intern-" + id})
	if err != nil {
		t.Fatal(err)
	}
	c.Admin(t, "intern", "resume", "--org", c.Org, "--id", id)
	var created *corev1.Pod
	for ev := range w.ResultChan() {
		if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == "ADDED" {
			f.a.Kill()
			created = pod
			break
		}
	}
	w.Stop()
	if created == nil {
		t.Fatal("no pod was created for the resumed intern")
	}
	f.b = f.c.Gateway(t, append([]string{"--no-bootstrap"}, f.args...)...)
	began := time.Now()
	turnOK(t, f.b, c.WK, id, "after the other replica died")
	pod, ok := f.pod(t, id)
	if !ok || pod.UID != created.UID {
		t.Fatalf("the pod the dead replica created was not the one woken: %v", pod)
	}
	t.Logf("woken by the other replica %v after the death", time.Since(began).Round(time.Millisecond))
	if n := f.podsStarted(id); n != 2 {
		t.Fatalf("pods started after the takeover: %d, want 2 in all", n)
	}
}

// A Pod's agent reaches its model through the gateway's relay with a
// placeholder key: the real key is added on the way out and never enters
// the Pod, and the relay answers only an awake intern's own token.
func TestKubernetesModelRelay(t *testing.T) {
	up := agenttest.NewUpstream(t, agenttest.Answer(upModel, 4, 2, "from the upstream"))
	f := newKubeFleetEnv(t, upstreamEnv(up))
	id, c := f.c.Demo, f.c
	turnOK(t, f.a, c.WK, id, "hello demo")
	// A new model replaces the Pod.
	connectCall(t, f.a, c.MK, "UpdateIntern", `{"id":"`+id+`","model":"`+upModel+`"}`)
	testutil.Eventually(t, wait, "the intern answers from the upstream model", func() bool {
		res := chat(t, f.b, c.WK, id, user("hello upstream"))
		if res.StatusCode != 200 {
			io.Copy(io.Discard, res.Body)
			return false
		}
		s := readAll(t, res)
		return s.Text == "from the upstream" && s.Finish == "stop"
	})
	if auths := up.Authorizations(); len(auths) != 1 || auths[0] != "Bearer e2e-upstream-key" {
		t.Fatalf("the upstream saw %v", auths)
	}
	var token string
	for _, st := range f.node.Started() {
		for _, kv := range st.Env {
			if strings.Contains(kv, "e2e-upstream-key") {
				t.Fatalf("the model key entered a pod: %s", kv)
			}
		}
		if st.Pod == "intern-"+id {
			token = st.Getenv("COHORT_MODEL_RELAY_TOKEN")
		}
	}
	pod, _ := f.pod(t, id)
	raw, _ := json.Marshal(pod)
	if len(token) < 32 || strings.Contains(string(raw), token) {
		t.Fatalf("the relay token must come from the Secret, not the spec (%d chars)", len(token))
	}

	// The relay answers this intern's token for this intern, and nothing else.
	post := func(path string) int {
		req, _ := http.NewRequest("POST", f.b.URL+path, strings.NewReader(`{"model":"`+upModel+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+agents.KeyPlaceholder)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	other := c.NewIntern(t, "other")
	wrong := token[:len(token)-1] + "A"
	if wrong == token {
		wrong = token[:len(token)-1] + "B"
	}
	for _, path := range []string{
		"/intern-relay/" + id + "/" + wrong + "/v1/chat/completions",
		"/intern-relay/" + id + "/v1/chat/completions",
		"/intern-relay/" + other + "/" + token + "/v1/chat/completions",
		"/intern-relay/" + id + "x/" + token + "/v1/chat/completions",
	} {
		if code := post(path); code != 404 {
			t.Errorf("%s: %d, want 404", strings.Replace(path, token, "TOKEN", 1), code)
		}
	}
	up.Push(agenttest.Answer(upModel, 1, 1, "relayed"))
	if code := post("/intern-relay/" + id + "/" + token + "/v1/chat/completions"); code != 200 {
		t.Fatalf("the intern's own relay: %d", code)
	}
	if auths := up.Authorizations(); len(auths) != 2 || auths[1] != "Bearer e2e-upstream-key" {
		t.Fatalf("the upstream saw %v", auths)
	}
}

// A known third-party agent in a Pod: its image holds the agents
// (--kube-agent-modules), it calls its model endpoint through the
// gateway's relay with a placeholder, and the endpoint gets the intern's
// vault secret, which no Pod ever held.
func TestKubernetesThirdPartyAgent(t *testing.T) {
	p, _ := agents.Lookup("codex")
	modules := requireAgent(t, p)
	sc := &script{agent: p.Name}
	model := modelserver.Start(t, sc.reply)
	port := model.Addr[strings.LastIndex(model.Addr, ":")+1:]
	f := newKubeFleet(t, "--agent-modules", modules, "--kube-agent-modules", modules,
		"--agent-endpoint", p.Name+"=http://model.localhost:"+port)
	ag := &agentGateway{c: f.c, gw: f.a, intern: createAgentIntern(t, f.a, f.c.WK, p.Name)}
	key := randomCanary("provider-key")
	ag.putSecret(t, p.KeySecret, "model.localhost", key)
	s := readAll(t, chat(t, f.b, f.c.WK, ag.intern, user("cohort-say: hello from a pod")))
	if s.Finish != "stop" || !strings.Contains(s.Text, "echo: hello from a pod") {
		t.Fatalf("%s in a pod: finish %q text %q error %v", p.Name, s.Finish, s.Text, s.Error)
	}
	if keys := sc.sawKeys(); len(keys) == 0 || keys[len(keys)-1] != key {
		t.Fatalf("the model saw keys %v, want the vault's", keys)
	}
	for _, st := range f.node.Started() {
		if st.Pod == "intern-"+ag.intern && !strings.Contains(strings.Join(st.Argv, " "), "--agent "+p.Name) {
			t.Fatalf("the pod does not run %s: %v", p.Name, st.Argv)
		}
		for _, kv := range st.Env {
			if strings.Contains(kv, key) {
				t.Fatalf("the provider key entered a pod: %s", kv)
			}
		}
	}
}
