// Package kubetest gives tests a real Kubernetes API server (etcd + kube-apiserver, built
// from tools/kube into the Go build cache) and a fake kubelet, Node, that runs Pods as
// local processes.
//
// There is no controller-manager or scheduler. The Cluster does the two controller jobs
// Pods depend on: each namespace's default ServiceAccount (the ServiceAccount admission
// plugin refuses Pods without it) and kube-root-ca.crt ConfigMap. Nothing else runs: no
// Deployment, StatefulSet or Job controllers, no garbage collection of ownerReferences, no
// namespace deletion (a deleted namespace stays Terminating), no PersistentVolume binding
// (claims stay Pending; Node runs their Pods anyway), no Service endpoints. The
// StorageObjectInUseProtection admission plugin is off, since no controller would lift its
// finalizer: claims are deleted at once.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/cohort-dev/cohort/internal/testing/gotool"
)

// Cluster is a running etcd and kube-apiserver private to one test.
type Cluster struct {
	Config     *rest.Config         // admin (system:masters) over TLS with the server's CA
	Client     kubernetes.Interface // admin clientset
	Kubeconfig string               // admin kubeconfig file, for `cohort serve --kube-config`
	URL        string               // https://127.0.0.1:port

	dir     string
	ca      *authority
	apiPath string
	apiArgs []string

	mu        sync.Mutex
	apiserver *process
	etcd      *process
	died      func(p *process) // reports a process that exits on its own: t.Errorf while the test runs
}

// Start returns a running etcd + kube-apiserver for t, stopped by t.Cleanup. Without the
// binaries the test is skipped, or fails when COHORT_REQUIRE_KUBERNETES=1.
func Start(t testing.TB) *Cluster {
	t.Helper()
	apiPath, etcdPath := binaries(t)
	c := &Cluster{dir: t.TempDir(), apiPath: apiPath}
	// etcd and the API server live as long as the test: one that exits on its own fails the
	// test with its exit status and the tail of its log, so that a flake names its cause.
	c.died = func(p *process) {
		t.Errorf("kubetest: %s died during the test: %s\n%s", p.name, p.describe(), tail(p.logPath, 30))
	}
	var err error
	if c.ca, err = newAuthority(); err != nil {
		t.Fatal(err)
	}
	token, err := c.writeFiles()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stopAll)

	// Free ports are found by binding and closing, so another process may take one before
	// etcd or the API server binds it; a new set of ports is tried then.
	for attempt := 1; ; attempt++ {
		err = c.boot(t, etcdPath)
		if err == nil {
			break
		}
		c.stopAll()
		if attempt == 3 {
			t.Fatalf("kubetest: %v", err)
		}
		t.Logf("kubetest: retrying with other ports: %v", err)
	}

	c.Config = &rest.Config{
		Host:            c.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.ca.certPEM},
		// client-go's default 5 requests/s would make tests wait on the client, not the server.
		QPS:   1000,
		Burst: 2000,
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		t.Fatal(err)
	}
	c.Kubeconfig = filepath.Join(c.dir, "admin.kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, &clientcmdapi.AuthInfo{Token: token}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.namespaceController(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// writeFiles writes the serving certificate, the client CA, the service account keys and
// the token file, and returns the admin token.
func (c *Cluster) writeFiles() (string, error) {
	certPEM, keyPEM, err := c.ca.issue("kube-apiserver", nil,
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"}, true)
	if err != nil {
		return "", err
	}
	saKey, saPub, err := newKeyPair()
	if err != nil {
		return "", err
	}
	token := randomHex(16)
	files := map[string][]byte{
		"ca.crt":     c.ca.certPEM,
		"server.crt": certPEM,
		"server.key": keyPEM,
		"sa.key":     saKey,
		"sa.pub":     saPub,
		"tokens.csv": []byte(token + ",admin,admin-uid,system:masters\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(c.dir, name), b, 0o600); err != nil {
			return "", err
		}
	}
	return token, nil
}

func (c *Cluster) boot(t testing.TB, etcdPath string) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	dataDir := filepath.Join(c.dir, "etcd")
	os.RemoveAll(dataDir)
	etcd, err := startProcess("etcd", etcdPath, filepath.Join(c.dir, "etcd.log"),
		"--name=default", "--data-dir="+dataDir,
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=default="+peer,
		"--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = etcd
	c.mu.Unlock()

	d := func(name string) string { return filepath.Join(c.dir, name) }
	c.URL = "https://127.0.0.1:" + strconv.Itoa(ports[2])
	c.apiArgs = []string{
		"--etcd-servers=" + client,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[2]),
		"--tls-cert-file=" + d("server.crt"), "--tls-private-key-file=" + d("server.key"),
		"--cert-dir=" + d("certs"),
		"--client-ca-file=" + d("ca.crt"),
		"--token-auth-file=" + d("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + d("sa.pub"),
		"--service-account-signing-key-file=" + d("sa.key"),
		// Nothing here would remove the kubernetes.io/pvc-protection finalizer (that is a
		// controller-manager job), so deleted claims would hang in Terminating.
		"--disable-admission-plugins=StorageObjectInUseProtection",
		// The default reconciler complains that 127.0.0.1 is not a valid endpoint.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
	}
	if err := c.startAPIServer(t); err != nil {
		return err
	}
	etcd.watch(c.died)
	return nil
}

func (c *Cluster) startAPIServer(t testing.TB) error {
	p, err := startProcess("kube-apiserver", c.apiPath, filepath.Join(c.dir, "kube-apiserver.log"), c.apiArgs...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.apiserver = p
	etcd := c.etcd
	c.mu.Unlock()

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.ca.pool()}}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case <-etcd.exited:
			return fmt.Errorf("etcd exited: %s\n%s", etcd.describe(), tail(etcd.logPath, 20))
		case <-p.exited:
			return fmt.Errorf("kube-apiserver exited: %s\n%s", p.describe(), tail(p.logPath, 30))
		default:
		}
		// /readyz needs no credentials (system:public-info-viewer).
		resp, err := hc.Get(c.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.watch(c.died)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready after 90s (last: %v)\n%s", err, tail(p.logPath, 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// StopAPIServer kills the kube-apiserver; etcd keeps the state. Clients get "connection refused"
// until StartAPIServer.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	p := c.apiserver
	c.apiserver = nil
	c.mu.Unlock()
	if p == nil {
		t.Fatal("kubetest: StopAPIServer: the API server is not running")
	}
	p.kill()
}

// StartAPIServer starts the kube-apiserver again on the same port with the same certificates
// and waits until it is ready.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	running := c.apiserver != nil
	c.mu.Unlock()
	if running {
		t.Fatal("kubetest: StartAPIServer: the API server is already running")
	}
	if err := c.startAPIServer(t); err != nil {
		t.Fatalf("kubetest: %v", err)
	}
}

func (c *Cluster) stopAll() {
	c.mu.Lock()
	api, etcd := c.apiserver, c.etcd
	c.apiserver, c.etcd = nil, nil
	c.mu.Unlock()
	if api != nil {
		api.kill()
	}
	if etcd != nil {
		etcd.kill()
	}
}

// Namespace creates a namespace with its default ServiceAccount, which the ServiceAccount
// admission plugin requires before it admits Pods.
func (c *Cluster) Namespace(t testing.TB, name string) {
	t.Helper()
	ctx := context.Background()
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("kubetest: create namespace %s: %v", name, err)
	}
	if err := c.populate(ctx, name); err != nil {
		t.Fatalf("kubetest: namespace %s: %v", name, err)
	}
}

// KubeconfigFor writes a kubeconfig that authenticates as user (with groups, besides
// system:authenticated) by a client certificate, and returns its path. RBAC decides what the
// user may do: bind Roles to it to test a restricted identity.
func (c *Cluster) KubeconfigFor(t testing.TB, user string, groups ...string) string {
	t.Helper()
	certPEM, keyPEM, err := c.ca.issue(user, groups, nil, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(c.dir, "user-*.kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := c.writeKubeconfig(f.Name(), &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// ConfigFor is KubeconfigFor as a rest.Config.
func (c *Cluster) ConfigFor(t testing.TB, user string, groups ...string) *rest.Config {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigFor(t, user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	return cfg
}

func (c *Cluster) writeKubeconfig(path string, auth *clientcmdapi.AuthInfo) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: c.URL, CertificateAuthorityData: c.ca.certPEM}
	cfg.AuthInfos["kubetest"] = auth
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	cfg.CurrentContext = "kubetest"
	return clientcmd.WriteToFile(*cfg, path)
}

// namespaceController does the controller-manager's part for every namespace, including
// those the code under test creates: the default ServiceAccount and kube-root-ca.crt.
func (c *Cluster) namespaceController(ctx context.Context) {
	follow(ctx,
		func(ctx context.Context, opts metav1.ListOptions) ([]corev1.Namespace, string, error) {
			l, err := c.Client.CoreV1().Namespaces().List(ctx, opts)
			if err != nil {
				return nil, "", err
			}
			return l.Items, l.ResourceVersion, nil
		},
		func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Client.CoreV1().Namespaces().Watch(ctx, opts)
		},
		func(items []corev1.Namespace) {
			for i := range items {
				c.ensure(ctx, &items[i])
			}
		},
		func(typ watch.EventType, ns *corev1.Namespace) {
			if typ == watch.Added || typ == watch.Modified {
				c.ensure(ctx, ns)
			}
		})
}

func (c *Cluster) ensure(ctx context.Context, ns *corev1.Namespace) {
	if ns.DeletionTimestamp != nil {
		return
	}
	// Errors are left for the next list: the API server may be down for a moment.
	c.populate(ctx, ns.Name)
}

func (c *Cluster) populate(ctx context.Context, ns string) error {
	_, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err = c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"},
		Data:       map[string]string{"ca.crt": string(c.ca.certPEM)},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// A process is etcd or kube-apiserver, its output going to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	started time.Time
	tid     int // the OS thread that forked it: its Pdeathsig fires when that thread ends
	exited  chan struct{}
	err     error
	killed  atomic.Bool // by kill: an exit that is no news
	tidGone bool        // the forking thread had ended when the process was found dead

	mu    sync.Mutex
	ended bool
	died  func(*process)
}

// startProcess starts path, its output going to logPath.
func startProcess(name, path, logPath string, args ...string) (*process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	if p.tid, err = start(cmd); err != nil {
		return nil, err
	}
	p.started = time.Now()
	go func() {
		p.err = cmd.Wait()
		p.tidGone = !threadAlive(p.tid)
		p.mu.Lock()
		p.ended = true
		died := p.died
		p.mu.Unlock()
		if died != nil && !p.killed.Load() {
			died(p)
		}
		close(p.exited)
	}()
	return p, nil
}

// watch has died called when the process exits other than by kill (before kill returns, if
// kill is called meanwhile); at once if it has exited already. Called once the process is up:
// one that fails to start is its starter's error (a port taken: tried again).
func (p *process) watch(died func(*process)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.died = died
	if p.ended && !p.killed.Load() {
		died(p)
	}
}

// describe says how the process ended: pid, exit status or signal, how long it ran, its
// peak memory, and whether the thread that forked it had ended (its Pdeathsig).
func (p *process) describe() string {
	ps := p.cmd.ProcessState
	if ps == nil {
		return fmt.Sprintf("pid %d: %v", p.cmd.Process.Pid, p.err)
	}
	s := fmt.Sprintf("pid %d: %s after %s, max RSS %s", ps.Pid(), ps, time.Since(p.started).Round(time.Millisecond), maxRSS(ps))
	if p.tidGone {
		s += fmt.Sprintf("; the thread that started it (tid %d) had ended, which sends its Pdeathsig (SIGKILL)", p.tid)
	}
	return s
}

func (p *process) kill() {
	p.killed.Store(true)
	killGroup(p.cmd.Process.Pid)
	<-p.exited
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// The binaries are found once per test binary; `go tool -n` takes under a second when cached.
var bins struct {
	sync.Mutex
	api, etcd string
}

// binaries returns the kube-apiserver and etcd executables, built by `go tool` from
// tools/kube into the Go build cache.
func binaries(t testing.TB) (api, etcd string) {
	t.Helper()
	bins.Lock()
	defer bins.Unlock()
	if bins.api != "" {
		return bins.api, bins.etcd
	}
	fail := func(err error) {
		t.Helper()
		how := "build them with: go tool -modfile=tools/kube/go.mod -n kube-apiserver && go tool -modfile=tools/kube/go.mod -n go.etcd.io/etcd/server/v3"
		if os.Getenv("COHORT_REQUIRE_KUBERNETES") == "1" {
			t.Fatalf("Kubernetes is required (COHORT_REQUIRE_KUBERNETES=1) but kube-apiserver/etcd are unavailable: %v; %s", err, how)
		}
		t.Skipf("!!! SKIPPING Kubernetes test: kube-apiserver/etcd unavailable: %v (%s; set COHORT_REQUIRE_KUBERNETES=1 to fail instead)", err, how)
	}
	paths, err := gotool.Build("kube", nil, "kube-apiserver", "go.etcd.io/etcd/server/v3")
	if err != nil {
		fail(err)
	}
	bins.api, bins.etcd = paths[0], paths[1]
	return bins.api, bins.etcd
}
