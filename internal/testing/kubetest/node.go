package kubetest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// DefaultNodeName is the Node object a Node registers and binds Pods to.
const DefaultNodeName = "kubetest-node"

// Node plays the kubelet for one namespace: it binds the namespace's unscheduled Pods to
// itself and runs each Pod's first container (after its init containers, in turn) as a
// local process, command[0] mapped through Binaries.
//
// Each Pod gets its own loopback address, 127.0.0.N, as Pod IP; there is no network
// namespace, so a process must listen on its Pod IP (e.g. $(POD_IP):8080), not on all
// addresses. Volumes become directories under Dir: a claim's is <Dir>/pvc/<claimName>,
// shared by every Pod naming the claim and kept after them; the others (emptyDir, secret,
// configMap, projected with a real service account token, downwardAPI) are the Pod's own
// and removed with it. As there is no mount namespace either, every mountPath found in the
// command, args, env values and workingDir is rewritten to its directory.
//
// Only readiness probes run (httpGet, tcpSocket, exec), every 100 ms. A process that exits
// ends its Pod (Succeeded or Failed): no restarts whatever the restartPolicy. Liveness and
// startup probes, securityContext, resources and nodeSelector are not enforced.
type Node struct {
	Client    kubernetes.Interface
	Namespace string
	// Binaries maps a container's command[0] (e.g. "/cohort" or "cohort"; its base name is
	// tried too) to an executable on this host. A container without a command is looked up
	// by its image.
	Binaries map[string]string
	Dir      string                           // where volumes become directories
	Log      func(format string, args ...any) // optional (t.Logf): processes' output, lifecycle
	// Env is extra environment for every process (e.g. HOME, or PATH to override the
	// runtime default /usr/local/sbin:…:/bin); the test's own environment is not passed on.
	Env  []string
	Name string // the Node object's name; DefaultNodeName when empty

	mu      sync.Mutex
	pods    map[types.UID]*pod
	ips     map[string]string // Pod name → its latest IP
	started []Started
	running int
	quiet   bool
	workers sync.WaitGroup
}

// Started records a process the Node ran, as it ran it.
type Started struct {
	Pod       string
	Container string
	IP        string
	Path      string   // the host executable
	Argv      []string // command and args after $(VAR) expansion and mount rewriting; Argv[0] as in the spec
	Env       []string // the container's environment after resolution, NAME=value, without Node.Env
	Dir       string   // working directory
}

// Getenv returns the value of name in s.Env.
func (s Started) Getenv(name string) string {
	for _, kv := range slices.Backward(s.Env) {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// Start runs n until t ends (Run in the background; the cleanup stops it and waits).
func (n *Node) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	})
}

// Run plays the node until ctx ends, then kills every process it started and returns nil.
// The API server may go away meanwhile: Run carries on when it is back. With Log set to
// t.Logf, Run must return before the test ends (Start sees to that).
func (n *Node) Run(ctx context.Context) error {
	if n.Client == nil || n.Namespace == "" || n.Dir == "" {
		return errors.New("kubetest: Node needs Client, Namespace and Dir")
	}
	n.mu.Lock()
	if n.pods != nil {
		n.mu.Unlock()
		return errors.New("kubetest: Node.Run called twice")
	}
	n.pods = map[types.UID]*pod{}
	n.ips = map[string]string{}
	n.quiet = false
	n.mu.Unlock()

	n.workers.Add(1)
	go func() { defer n.workers.Done(); n.register(ctx) }()
	pods := n.Client.CoreV1().Pods(n.Namespace)
	follow(ctx,
		func(ctx context.Context, opts metav1.ListOptions) ([]corev1.Pod, string, error) {
			l, err := pods.List(ctx, opts)
			if err != nil {
				return nil, "", err
			}
			return l.Items, l.ResourceVersion, nil
		},
		pods.Watch,
		n.synced,
		func(typ watch.EventType, obj *corev1.Pod) {
			switch typ {
			case watch.Added, watch.Modified:
				n.observe(obj)
			case watch.Deleted:
				n.vanished(obj.UID)
			}
		})

	n.mu.Lock()
	for _, p := range n.pods {
		p.cancel()
	}
	n.mu.Unlock()
	n.workers.Wait()
	n.mu.Lock()
	n.quiet = true
	n.pods = nil
	n.mu.Unlock()
	return nil
}

// Running returns how many processes are alive now.
func (n *Node) Running() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.running
}

// PodIP returns the address given to the latest Pod called name, or "".
func (n *Node) PodIP(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ips[name]
}

// Started returns the processes run so far, oldest first.
func (n *Node) Started() []Started {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.started)
}

func (n *Node) nodeName() string {
	if n.Name != "" {
		return n.Name
	}
	return DefaultNodeName
}

func (n *Node) logf(format string, args ...any) {
	n.mu.Lock()
	quiet := n.quiet
	n.mu.Unlock()
	if n.Log != nil && !quiet {
		n.Log(format, args...)
	}
}

// register creates the Node object Pods are bound to and reports it Ready, for code that
// looks at nodes; nothing else depends on it.
func (n *Node) register(ctx context.Context) {
	nodes := n.Client.CoreV1().Nodes()
	name := n.nodeName()
	for ctx.Err() == nil {
		_, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": runtime.GOOS},
		}}, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	for ctx.Err() == nil {
		node, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			now := metav1.Now()
			capacity := corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
				corev1.ResourceMemory: resource.MustParse("8Gi"),
				corev1.ResourcePods:   resource.MustParse("110"),
			}
			node.Status.Capacity, node.Status.Allocatable = capacity, capacity
			node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}}
			node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
				Message: "kubetest node", LastHeartbeatTime: now, LastTransitionTime: now}}
			if _, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err == nil {
				return
			}
		}
		sleep(ctx, 200*time.Millisecond)
	}
}

// A pod is the Node's state for one Pod object (by UID: a Pod recreated under the same name
// is another pod).
type pod struct {
	uid    types.UID
	name   string
	ip     string
	ipLock *os.File
	dir    string // <Dir>/pods/<uid>: emptyDirs, secret and configMap files, the root for working dirs

	ctx      context.Context
	cancel   context.CancelFunc // the object is gone, or Run is returning
	gone     atomic.Bool
	term     chan struct{} // closed when the Pod gets a deletionTimestamp
	termOnce sync.Once

	mu    sync.Mutex
	obj   *corev1.Pod
	st    podState
	dirty chan struct{}
}

// podState is what the Node reports in the Pod's status.
type podState struct {
	phase           corev1.PodPhase
	reason, message string
	start           metav1.Time
	ctr             corev1.ContainerState
	containerID     string
	started         bool
	ready           bool
	initialized     bool
}

func (p *pod) object() *corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.obj
}

func (p *pod) terminating() bool {
	select {
	case <-p.term:
		return true
	default:
		return false
	}
}

// pause waits d; false when the Pod is being deleted or is gone.
func (p *pod) pause(d time.Duration) bool {
	select {
	case <-p.ctx.Done():
		return false
	case <-p.term:
		return false
	case <-time.After(d):
		return true
	}
}

// ipCounter numbers Pod addresses: 127.0.0.10, 127.0.0.11, …
var ipCounter atomic.Int64

func init() { ipCounter.Store(10) }

func allocIP() (string, *os.File) {
	for {
		n := ipCounter.Add(1) - 1
		if n%256 == 0 || n%256 == 255 {
			continue
		}
		ip := fmt.Sprintf("127.%d.%d.%d", n>>16&255, n>>8&255, n&255)
		if f, ok := lockIP(ip); ok {
			return ip, f
		}
	}
}

func (n *Node) synced(items []corev1.Pod) {
	seen := map[types.UID]bool{}
	for i := range items {
		seen[items[i].UID] = true
		n.observe(&items[i])
	}
	n.mu.Lock()
	var gone []types.UID
	for uid := range n.pods {
		if !seen[uid] {
			gone = append(gone, uid)
		}
	}
	n.mu.Unlock()
	for _, uid := range gone {
		n.vanished(uid)
	}
}

func (n *Node) observe(obj *corev1.Pod) {
	obj = obj.DeepCopy()
	n.mu.Lock()
	p := n.pods[obj.UID]
	if p == nil {
		if obj.Spec.NodeName != "" && obj.Spec.NodeName != n.nodeName() ||
			obj.Status.Phase == corev1.PodSucceeded || obj.Status.Phase == corev1.PodFailed {
			n.mu.Unlock()
			return
		}
		p = &pod{uid: obj.UID, name: obj.Name, obj: obj, term: make(chan struct{}), dirty: make(chan struct{}, 1)}
		p.ip, p.ipLock = allocIP()
		p.dir = n.Dir + "/pods/" + string(obj.UID)
		p.ctx, p.cancel = context.WithCancel(context.Background())
		p.st = podState{phase: corev1.PodPending, start: metav1.Now(),
			ctr: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}
		n.pods[obj.UID] = p
		n.ips[obj.Name] = p.ip
		n.workers.Add(1)
		go n.work(p)
	}
	n.mu.Unlock()
	p.mu.Lock()
	p.obj = obj
	p.mu.Unlock()
	if obj.DeletionTimestamp != nil {
		p.termOnce.Do(func() { close(p.term) })
	}
}

// vanished: the object is gone (deleted with no grace, or confirmed): kill what runs.
func (n *Node) vanished(uid types.UID) {
	n.mu.Lock()
	p := n.pods[uid]
	n.mu.Unlock()
	if p != nil {
		p.gone.Store(true)
		p.cancel()
	}
}

func (n *Node) forget(p *pod) {
	n.mu.Lock()
	if n.pods[p.uid] == p {
		delete(n.pods, p.uid)
	}
	n.mu.Unlock()
	if p.ipLock != nil {
		p.ipLock.Close()
	}
}

// work is a Pod's life on the node: bind, prepare, run, and on deletion stop the process and
// confirm the deletion, as a kubelet does.
func (n *Node) work(p *pod) {
	defer n.workers.Done()
	defer n.forget(p)
	defer p.cancel()
	go n.statusLoop(p)
	if !n.bind(p) {
		return
	}
	n.markDirty(p)
	n.live(p)
	select {
	case <-p.term:
		// The Pod's own directories go before the deletion is confirmed,
		// as a kubelet tears down volumes first: whoever sees the object
		// gone finds them gone too.
		os.RemoveAll(p.dir)
		n.confirmDelete(p)
	case <-p.ctx.Done():
		if p.gone.Load() {
			os.RemoveAll(p.dir)
		}
	}
}

func (n *Node) bind(p *pod) bool {
	pods := n.Client.CoreV1().Pods(n.Namespace)
	for {
		switch name := p.object().Spec.NodeName; name {
		case n.nodeName():
			return true
		case "":
		default:
			return false
		}
		err := pods.Bind(p.ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: n.Namespace, UID: p.uid},
			Target:     corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: n.nodeName()},
		}, metav1.CreateOptions{})
		switch {
		case err == nil:
			return true
		case apierrors.IsNotFound(err):
			return false
		case apierrors.IsConflict(err): // bound meanwhile: by whom?
			if cur, err := pods.Get(p.ctx, p.name, metav1.GetOptions{}); err == nil && cur.UID == p.uid {
				return cur.Spec.NodeName == n.nodeName()
			}
		}
		if !p.pause(100 * time.Millisecond) {
			return false
		}
	}
}

// live prepares and runs the Pod's containers; it returns when the main process has exited
// (status reported), or when the Pod is being deleted or is gone (process stopped).
func (n *Node) live(p *pod) {
	var pl *plan
	for {
		var err error
		if pl, err = n.prepare(p, p.object()); err == nil {
			break
		}
		var w *waitError
		if !errors.As(err, &w) {
			n.fail(p, err.Error())
			return
		}
		n.setStatus(p, func(s *podState) {
			s.reason, s.message = "", ""
			s.ctr = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: w.reason, Message: w.msg}}
		})
		if !p.pause(200 * time.Millisecond) {
			return
		}
	}
	for _, c := range pl.init {
		pr, err := n.spawn(p, c)
		if err != nil {
			n.fail(p, err.Error())
			return
		}
		if !n.await(p, pr) {
			return
		}
		if pr.code != 0 {
			n.fail(p, fmt.Sprintf("init container %s exited with code %d", c.name, pr.code))
			return
		}
	}
	if p.terminating() || p.ctx.Err() != nil {
		return
	}
	pr, err := n.spawn(p, pl.main)
	if err != nil {
		n.fail(p, err.Error())
		return
	}
	n.setStatus(p, func(s *podState) {
		s.phase, s.initialized, s.started = corev1.PodRunning, true, true
		s.containerID = "kubetest://" + strconv.Itoa(pr.cmd.Process.Pid)
		s.ctr = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: pr.startedAt}}
	})
	go n.probe(p, pl.main, pr)
	if !n.await(p, pr) {
		return
	}
	n.logf("%s: exited with code %d", p.name, pr.code)
	n.setStatus(p, func(s *podState) {
		s.phase, s.ready = corev1.PodSucceeded, false
		reason := "Completed"
		if pr.code != 0 {
			s.phase, reason = corev1.PodFailed, "Error"
		}
		s.ctr = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(pr.code), Reason: reason,
			StartedAt: pr.startedAt, FinishedAt: metav1.Now(), ContainerID: s.containerID}}
	})
}

// fail ends the Pod without (further) running it: the kubelet could not run what it asks.
func (n *Node) fail(p *pod, msg string) {
	n.logf("%s: failed: %s", p.name, msg)
	n.setStatus(p, func(s *podState) {
		s.phase, s.ready, s.reason, s.message = corev1.PodFailed, false, "KubetestError", msg
		if s.ctr.Terminated == nil {
			s.ctr = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: msg, FinishedAt: metav1.Now()}}
		}
	})
}

// await waits for the process to exit (true), or stops it when the Pod is deleted or gone (false).
func (n *Node) await(p *pod, pr *proc) bool {
	select {
	case <-pr.exited:
		return true
	case <-p.ctx.Done():
		if p.gone.Load() {
			n.logf("%s: the Pod is gone: killing pid %d", p.name, pr.cmd.Process.Pid)
		}
		pr.kill()
		return false
	case <-p.term:
	}
	// SIGTERM, the grace period (capped: tests should not wait 30 s), then SIGKILL.
	grace := 30 * time.Second
	if g := p.object().DeletionGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	grace = min(grace, 5*time.Second)
	n.logf("%s: deleted: stopping pid %d (SIGTERM, SIGKILL after %s)", p.name, pr.cmd.Process.Pid, grace)
	if grace > 0 {
		pr.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-pr.exited:
		case <-p.ctx.Done():
		case <-time.After(grace):
		}
	}
	pr.kill()
	return false
}

func (n *Node) confirmDelete(p *pod) {
	zero := int64(0)
	for {
		err := n.Client.CoreV1().Pods(n.Namespace).Delete(p.ctx, p.name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero,
			Preconditions:      &metav1.Preconditions{UID: &p.uid},
		})
		if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return
		}
		if !sleepCtx(p.ctx, 200*time.Millisecond) {
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	sleep(ctx, d)
	return ctx.Err() == nil
}

// A proc is a container's process.
type proc struct {
	cmd       *exec.Cmd
	startedAt metav1.Time
	exited    chan struct{}
	code      int
}

func (pr *proc) kill() {
	killGroup(pr.cmd.Process.Pid)
	<-pr.exited
}

func (n *Node) spawn(p *pod, c *containerPlan) (*proc, error) {
	cmd := exec.Command(c.path, c.argv[1:]...)
	cmd.Env = n.processEnv(p, c)
	cmd.Dir = c.dir
	prefix := p.name + ": "
	if c.init {
		prefix = p.name + "/" + c.name + ": "
	}
	out := &lineWriter{log: n.logf, prefix: prefix}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	// Children that keep the output open must not hold up Wait.
	cmd.WaitDelay = time.Second
	if _, err := start(cmd); err != nil {
		return nil, fmt.Errorf("container %s: %v", c.name, err)
	}
	pr := &proc{cmd: cmd, startedAt: metav1.Now(), exited: make(chan struct{})}
	n.mu.Lock()
	n.running++
	n.started = append(n.started, Started{Pod: p.name, Container: c.name, IP: p.ip, Path: c.path,
		Argv: slices.Clone(c.argv), Env: slices.Clone(c.env), Dir: c.dir})
	n.mu.Unlock()
	n.logf("%s: started %s (pid %d, ip %s)", p.name, strings.Join(c.argv, " "), cmd.Process.Pid, p.ip)
	go func() {
		cmd.Wait()
		pr.code = exitCode(cmd.ProcessState)
		// Like a container's end, the process's end takes what it spawned along.
		killGroup(cmd.Process.Pid)
		out.flush()
		n.mu.Lock()
		n.running--
		n.mu.Unlock()
		close(pr.exited)
	}()
	return pr, nil
}

// processEnv is what a container runtime gives: its defaults (PATH, unless set; HOSTNAME),
// then Node.Env, then the container's own. Nothing comes from the test's environment.
func (n *Node) processEnv(p *pod, c *containerPlan) []string {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + p.name}
	env = append(env, n.Env...)
	return append(env, c.env...) // later entries win (os/exec keeps the last of duplicates)
}

// probe reports readiness: polled every 100 ms until ready, then every 500 ms, turning
// unready after failureThreshold failures. Liveness and startup probes are not run.
func (n *Node) probe(p *pod, c *containerPlan, pr *proc) {
	pb := c.spec.ReadinessProbe
	if pb == nil {
		n.setStatus(p, func(s *podState) { s.ready = true })
		return
	}
	threshold := int(pb.FailureThreshold)
	if threshold <= 0 {
		threshold = 3
	}
	ready, fails, every := false, 0, time.Duration(0)
	for {
		select {
		case <-pr.exited:
			return
		case <-p.ctx.Done():
			return
		case <-p.term:
			return
		case <-time.After(every):
		}
		every = 100 * time.Millisecond
		if n.check(p, c, pb) {
			fails = 0
			if !ready {
				ready = true
				n.setStatus(p, func(s *podState) {
					if s.phase == corev1.PodRunning {
						s.ready = true
					}
				})
			}
		} else if ready {
			if fails++; fails >= threshold {
				ready = false
				n.setStatus(p, func(s *podState) { s.ready = false })
			}
		}
		if ready {
			every = 500 * time.Millisecond
		}
	}
}

var probeClient = &http.Client{
	Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as the kubelet: probes do not verify
		DisableKeepAlives: true,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

func (n *Node) check(p *pod, c *containerPlan, pb *corev1.Probe) bool {
	timeout := time.Duration(max(pb.TimeoutSeconds, 1)) * time.Second
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	switch {
	case pb.HTTPGet != nil:
		g := pb.HTTPGet
		port, err := portNumber(c.spec, g.Port)
		if err != nil {
			return false
		}
		host := g.Host
		if host == "" {
			host = p.ip
		}
		scheme := strings.ToLower(string(g.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		path := g.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+net.JoinHostPort(host, strconv.Itoa(port))+path, nil)
		if err != nil {
			return false
		}
		for _, h := range g.HTTPHeaders {
			req.Header.Set(h.Name, h.Value)
		}
		resp, err := probeClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	case pb.TCPSocket != nil:
		port, err := portNumber(c.spec, pb.TCPSocket.Port)
		if err != nil {
			return false
		}
		host := pb.TCPSocket.Host
		if host == "" {
			host = p.ip
		}
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		conn.Close()
		return true
	case pb.Exec != nil && len(pb.Exec.Command) > 0:
		argv := make([]string, len(pb.Exec.Command))
		for i, a := range pb.Exec.Command {
			argv[i] = c.rewrite(a)
		}
		path, err := n.binary(argv[0])
		if err != nil {
			return false
		}
		cmd := exec.CommandContext(ctx, path, argv[1:]...)
		cmd.Env = n.processEnv(p, c)
		cmd.Dir = c.dir
		return cmd.Run() == nil
	default: // gRPC probes: not supported; the Pod counts as ready
		return true
	}
}

func portNumber(c *corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return strconv.Atoi(port.StrVal)
}

func (n *Node) setStatus(p *pod, f func(*podState)) {
	p.mu.Lock()
	f(&p.st)
	p.mu.Unlock()
	n.markDirty(p)
}

func (n *Node) markDirty(p *pod) {
	select {
	case p.dirty <- struct{}{}:
	default:
	}
}

// statusLoop writes the Pod's status whenever it changes, retrying while the API server is
// away; each write carries the latest state.
func (n *Node) statusLoop(p *pod) {
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.dirty:
		}
		for n.pushStatus(p) != nil {
			if !sleepCtx(p.ctx, 200*time.Millisecond) {
				return
			}
		}
	}
}

func (n *Node) pushStatus(p *pod) error {
	pods := n.Client.CoreV1().Pods(n.Namespace)
	cur, err := pods.Get(p.ctx, p.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && cur.UID != p.uid {
		return nil
	}
	if err != nil {
		return err
	}
	if cur.Spec.NodeName == "" {
		return errors.New("not bound yet")
	}
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	cur.Status = n.status(p, st, cur)
	_, err = pods.UpdateStatus(p.ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (n *Node) status(p *pod, s podState, cur *corev1.Pod) corev1.PodStatus {
	now := metav1.Now()
	cond := func(t corev1.PodConditionType, ok bool) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: now}
		if ok {
			c.Status = corev1.ConditionTrue
		}
		for _, old := range cur.Status.Conditions {
			if old.Type == t && old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	conds := []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, true),
		cond(corev1.PodInitialized, s.initialized || len(cur.Spec.InitContainers) == 0),
		cond(corev1.ContainersReady, s.ready),
		cond(corev1.PodReady, s.ready),
		cond(corev1.PodScheduled, true),
	}
	for _, old := range cur.Status.Conditions { // others' conditions (e.g. DisruptionTarget) stay
		if !slices.ContainsFunc(conds, func(c corev1.PodCondition) bool { return c.Type == old.Type }) {
			conds = append(conds, old)
		}
	}
	st := corev1.PodStatus{
		Phase:      s.phase,
		Reason:     s.reason,
		Message:    s.message,
		Conditions: conds,
		HostIP:     "127.0.0.1",
		HostIPs:    []corev1.HostIP{{IP: "127.0.0.1"}},
		PodIP:      p.ip,
		PodIPs:     []corev1.PodIP{{IP: p.ip}},
		StartTime:  &s.start,
		QOSClass:   cur.Status.QOSClass,
	}
	if len(cur.Spec.Containers) > 0 {
		c := cur.Spec.Containers[0]
		started := s.started && s.ctr.Running != nil
		st.ContainerStatuses = []corev1.ContainerStatus{{
			Name: c.Name, Image: c.Image, ImageID: "kubetest://" + c.Image, ContainerID: s.containerID,
			State: s.ctr, Ready: s.ready, Started: &started,
		}}
	}
	return st
}

// lineWriter logs a process's output line by line.
type lineWriter struct {
	log    func(format string, args ...any)
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := slices.Index(w.buf, '\n')
		if i < 0 {
			break
		}
		w.log("%s%s", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.log("%s%s", w.prefix, w.buf)
		w.buf = nil
	}
}
