package gvisor

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// The gateway's binary is each sandbox's init (PID 1 inside, started with
// initEnv set, before main runs): it takes the secret from its stdin,
// opens the daemon's socket and the relays' loopback ports, starts the
// daemon with the first as fd 3 and the secret on a pipe as fd 4, as the
// namespace jail's init does, reaps what is orphaned to it and passes
// SIGTERM on. It exits with the daemon (ADR 0981).
func init() {
	if v := os.Getenv(initEnv); v != "" && os.Getpid() == 1 {
		os.Exit(runInit(v))
	}
}

func initFail(step string, err error) int {
	fmt.Fprintf(os.Stderr, "gvisor init: %s: %v\n", step, err)
	return 126
}

func runInit(conf string) int {
	os.Unsetenv(initEnv)
	// Nothing else of the sandbox's user may read this process's memory
	// (the secret passes through it).
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	var c initConfig
	if err := json.Unmarshal([]byte(conf), &c); err != nil {
		return initFail("read config", err)
	}
	secret, err := io.ReadAll(io.LimitReader(os.Stdin, 4096))
	if err != nil {
		return initFail("read secret", err)
	}
	os.Stdin.Close()
	lf, err := listenFile(c.Listen)
	if err != nil {
		return initFail("daemon socket", err)
	}
	for _, r := range c.Relays {
		rl, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", r.Port))
		if err != nil {
			return initFail("relay port", err)
		}
		go bridge(rl, r.Sock)
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		return initFail("secret pipe", err)
	}
	sw.Write(secret)
	sw.Close()
	clear(secret)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return initFail("stdin", err)
	}
	dir := c.Dir
	if dir == "" {
		dir = "/"
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGCHLD)
	p, err := os.StartProcess(c.Argv[0], c.Argv, &os.ProcAttr{Dir: dir, Env: c.Env,
		Files: []*os.File{devnull, os.Stdout, os.Stderr, lf, sr}})
	if err != nil {
		return initFail("start the daemon", err)
	}
	lf.Close()
	sr.Close()
	devnull.Close()
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			p.Signal(sig)
			continue
		}
		// Reap every child that ended (orphans come to PID 1); the
		// daemon's end is the sandbox's.
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err != nil || pid <= 0 {
				break
			}
			if pid == p.Pid {
				if ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ws.ExitStatus()
			}
		}
	}
	return 0
}

// bridge passes each connection accepted on ln to the unix socket sock:
// in the sandbox, a relay's loopback port to the gateway's host socket of
// its kind; in the gateway, the daemon's loopback address to its socket in
// the sandbox.
func bridge(ln net.Listener, sock string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("unix", sock)
			if err != nil {
				return
			}
			defer up.Close()
			splice(c, up)
		}()
	}
}

// splice copies both ways until both directions end, passing each half
// close on.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// listenFile is a listening unix socket at path, as a file to pass on
// (the daemon's fd 3); no Go listener of this process shares it.
func listenFile(path string) (*os.File, error) {
	os.Remove(path)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Listen(fd, 1024); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}
