package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/cohort-dev/cohort/internal/bootstrap"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/provision"
	"github.com/cohort-dev/cohort/internal/server"
)

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", env("COHORT_LISTEN", cfg.Listen), "address for HTTP/1.1 and h2c (COHORT_LISTEN)")
	dbFlags(fs, &cfg)
	fs.BoolVar(&cfg.NoBootstrap, "no-bootstrap", envBool("COHORT_NO_BOOTSTRAP", false), "do not create the default organization and keys on an empty database (COHORT_NO_BOOTSTRAP)")
	fs.StringVar(&cfg.LogLevel, "log-level", env("COHORT_LOG_LEVEL", cfg.LogLevel), "debug, info, warn or error (COHORT_LOG_LEVEL)")
	fs.StringVar(&cfg.Provisioner, "provisioner", env("COHORT_PROVISIONER", cfg.Provisioner), "local: the gateway runs each intern's daemon; remote: the operator runs them and registers each (COHORT_PROVISIONER)")
	regional := fs.String("regional-hosts", env("COHORT_REGIONAL_HOSTS", ""), "comma-separated regional API hostnames on which the vault refuses requests (COHORT_REGIONAL_HOSTS)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "how long graceful shutdown waits for requests")
	federationFlags(fs, &cfg)
	chatFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Provisioner != provision.Local && cfg.Provisioner != provision.Remote {
		return fmt.Errorf("--provisioner must be local or remote, not %q", cfg.Provisioner)
	}
	cfg.RegionalHosts = splitList(*regional)
	log, err := newLogger(stderr, cfg.LogLevel)
	if err != nil {
		return err
	}
	db, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()

	if !cfg.NoBootstrap {
		res, err := bootstrap.Run(ctx, db)
		if err != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		if res != nil {
			path, err := bootstrap.Write(cfg.DataDir, res)
			if err != nil {
				return fmt.Errorf("write bootstrap file: %w", err)
			}
			fmt.Fprintf(stdout, "Bootstrapped a new database. These keys are shown once; they are also in %s (mode 0600).\n", path)
			fmt.Fprintf(stdout, "  organization_id: %s\n  management_key:  %s\n  workspace_id:    %s\n  workspace_key:   %s\n  intern_id:       %s\n",
				res.OrganizationID, res.ManagementKey, res.WorkspaceID, res.WorkspaceKey, res.InternID)
		}
	}

	kek, err := loadKEK(cfg)
	if err != nil {
		return err
	}
	srv := server.New(db, kek, log)
	stopChat, err := startChat(ctx, srv, cfg)
	if err != nil {
		return err
	}
	defer stopChat()
	// Listen first: local daemons are told where the gateway is.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	prov := &provision.Provisioner{DB: db, KEK: kek, Log: log, Mode: cfg.Provisioner, DataDir: cfg.DataDir,
		GatewayURL: localGatewayURL(ln.Addr()), AgentCommand: cfg.AgentCommand}
	srv.Provisioner, srv.Interns.Lifecycle, srv.Chat.Daemons = prov, prov, prov
	defer prov.Close()
	if err := prov.Start(ctx); err != nil {
		return fmt.Errorf("start interns: %w", err)
	}
	srv.Vault.RegionalHosts = cfg.RegionalHosts
	stopFederation, err := startFederation(ctx, srv, cfg)
	if err != nil {
		return err
	}
	defer stopFederation()
	hs := server.HTTPServer(cfg.Listen, srv.Handler(), log)
	fmt.Fprintf(stdout, "Cohort is listening on http://%s (API under %s)\n", ln.Addr(), server.Prefix)
	log.Info("listening", "addr", ln.Addr().String())

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// splitList splits a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// localGatewayURL is how a daemon on this machine reaches the gateway's
// API: the listener's port on loopback when it listens on every address.
func localGatewayURL(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + server.Prefix
}
