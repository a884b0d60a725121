// podprog is the "image" of kubetest's own tests: it serves its environment and a state
// file over HTTP, the way a real workload would show what the kubelet gave it.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	listen := flag.String("listen", "", "address to serve on")
	state := flag.String("state", "", "file: its previous content is served at /state, then it is overwritten")
	exit := flag.Int("exit", -1, "exit at once with this code")
	flag.Parse()
	if *exit >= 0 {
		fmt.Println("exiting with", *exit)
		os.Exit(*exit)
	}
	prev, _ := os.ReadFile(*state)
	if err := os.WriteFile(*state, []byte("written by "+os.Getenv("POD_NAME")), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {})
	http.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, os.Getenv(r.FormValue("name"))) })
	http.HandleFunc("/state", func(w http.ResponseWriter, r *http.Request) { w.Write(prev) })
	srv := &http.Server{Addr: *listen}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); fmt.Println("SIGTERM"); srv.Shutdown(context.Background()) }()
	fmt.Println("serving on", *listen)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
