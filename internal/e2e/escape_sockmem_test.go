package e2e_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// sockFill is a self-drive command: 250 loopback TCP connections to a
// listener of its own, never read, written into until the kernel takes no
// more (or 1 GiB in all: past it the memory has escaped anyway), then
// held for a few seconds while the test measures the host.
const sockFill = `python3 -c 'import socket, time
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(512)
cs, held = [], []
for i in range(250):
    c = socket.create_connection(ls.getsockname())
    held.append(ls.accept()[0])
    c.setblocking(False)
    cs.append(c)
buf = bytes(262144)
total, cap = 0, 1 << 30
for r in range(40):
    prog = 0
    for c in cs:
        while total < cap:
            try:
                n = c.send(buf)
            except OSError:
                break
            total += n
            prog += n
    if total >= cap or (prog == 0 and r >= 3):
        break
    time.sleep(0.2)
print("filled", len(cs), total, flush=True)
time.sleep(5)
print("held", len(held))' 2>&1`

// hostTCPMem is the host's TCP memory in bytes (/proc/net/sockstat).
func hostTCPMem(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`TCP:.* mem (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no TCP mem in %q", b)
	}
	pages, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return pages * int64(os.Getpagesize())
}

// From an intern's own shell, through the real gateway and jail: 250
// loopback TCP connections filled without reading cost the host no more
// than the intern's memory limit (plus the kernel's per-socket minimum):
// the socket buffers are charged to the jail, and writes past its limit
// wait. Before, on cgroup v1, they were charged to nothing: the host lost
// gigabytes while the jail's cgroup showed megabytes (issue 36, row 3).
func TestEscapeSocketBuffers(t *testing.T) {
	const limit = 256 << 20
	c, gw := newCluster(t, "", "--provisioner", "local", "--log-level", "info", "--intern-memory", "256MiB")
	tg := &target{c: c, gw: gw}
	tg.waitRunning(t, c.Demo)
	if strings.Contains(gw.stderr.String(), "socket buffers") {
		t.Skipf("this host cannot charge socket buffers to a jail: %s", tail(gw.stderr.String(), 1000))
	}
	before := hostTCPMem(t)
	var (
		mu   sync.Mutex
		peak = before
		stop = make(chan struct{})
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if m := hostTCPMem(t); m > 0 {
				mu.Lock()
				peak = max(peak, m)
				mu.Unlock()
			}
		}
	}()
	out := tg.run(t, "self-drive", sockFill, true)
	close(stop)
	wg.Wait()
	m := regexp.MustCompile(`filled (\d+) (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the command did not fill its connections:\n%s", tail(out, 2000))
	}
	conns, _ := strconv.Atoi(m[1])
	written, _ := strconv.ParseInt(m[2], 10, 64)
	grew := peak - before
	t.Logf("%d connections, %d MiB written into them; the host's TCP memory: %d MiB before, +%d MiB at most while they were held (intern memory limit %d MiB)",
		conns, written>>20, before>>20, grew>>20, limit>>20)
	if conns != 250 {
		t.Fatalf("%d connections made, want 250:\n%s", conns, tail(out, 2000))
	}
	// The kernel force-charges a socket's minimum send buffer past the
	// limit (about 70 KiB a connection, measured): allowed per connection.
	allowed := int64(limit + conns*(128<<10))
	if written > allowed {
		t.Errorf("%d MiB written into unread connections of an intern limited to %d MiB", written>>20, limit>>20)
	}
	// Other TCP sockets of the host move the figure too: 32 MiB for them.
	if grew > allowed+32<<20 {
		t.Errorf("the host's TCP memory grew by %d MiB, past the intern's limit of %d MiB", grew>>20, limit>>20)
	}
}
