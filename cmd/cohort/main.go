// Command cohort is the Cohort service: the gateway (serve), the operator's
// CLI (admin) and the database migrator (migrate).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/buildinfo"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/envelope"
	"github.com/cohort-dev/cohort/internal/store"
)

const usage = `cohort — hosts interns (long-running AI agents) behind an OpenAI-compatible API.

Usage:
  cohort serve   [flags]       run the gateway
  cohort admin   <noun> <verb> the operator's CLI (cohort admin help)
  cohort migrate [flags]       apply database migrations and exit
  cohort intern  [flags]       run one intern's daemon (started by serve's local provisioner, or by you)
  cohort agent   [flags]       the built-in ACP agent on stdin/stdout
  cohort version               print the version, commit and Go version (also --version)

The load commands of docs/benchmarks.md are a separate command: go run ./cmd/cohort-bench.

Run "cohort <command> -h" for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := profiled(func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "cohort:", err)
		}
		os.Exit(1)
	}
}

// profiled runs f under a CPU profile written to
// $COHORT_CPUPROFILE.<command>.pprof when that variable is set (any command;
// `cohort-bench chat --profile-dir` sets it for the gateway and daemon it
// starts, and the agents a daemon starts inherit it, hence the command in
// the name).
func profiled(f func() error) error {
	prefix := os.Getenv("COHORT_CPUPROFILE")
	if prefix == "" || len(os.Args) < 2 {
		return f()
	}
	out, err := os.Create(prefix + "." + filepath.Base(os.Args[1]) + ".pprof")
	if err != nil {
		return err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return f()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing command")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "admin":
		return admin(ctx, args[1:], stdout, stderr)
	case "migrate":
		return migrateCmd(ctx, args[1:], stdout, stderr)
	case "intern":
		return internCmd(ctx, args[1:], stdout, stderr)
	case "agent":
		return agentCmd(ctx, args[1:], os.Stdin, stdout, stderr)
	case "bench":
		return errors.New(strings.TrimSpace("the load commands left the product binary: go run ./cmd/cohort-bench " + strings.Join(args[1:], " ")))
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, buildinfo.Get())
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// env returns the value of a COHORT_* variable, or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envBool(name string, def bool) bool {
	if v, ok := os.LookupEnv(name); ok {
		b, err := strconv.ParseBool(v)
		if err == nil {
			return b
		}
	}
	return def
}

// dbFlags registers the flags every command that opens the database shares.
func dbFlags(fs *flag.FlagSet, cfg *config.Config) {
	fs.StringVar(&cfg.DataDir, "data-dir", env("COHORT_DATA_DIR", cfg.DataDir), "data directory: embedded database, key files, bootstrap.json (COHORT_DATA_DIR)")
	fs.StringVar(&cfg.KEKFile, "kek-file", env("COHORT_KEK_FILE", cfg.KEKFile), "key-encryption key (Tink keyset JSON); default <data-dir>/kek.json, created on first start (COHORT_KEK_FILE)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", env("COHORT_DATABASE_URL", cfg.DatabaseURL), "postgres://… for PostgreSQL; empty for the embedded SQLite file in the data directory (COHORT_DATABASE_URL)")
}

// openDB opens and migrates the configured database.
func openDB(ctx context.Context, cfg config.Config) (*bun.DB, error) {
	db, err := store.Open(ctx, cfg.DatabaseURL, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// loadKEK loads the configured key-encryption key. The default file in the
// data directory is created on first use; an operator-supplied one must exist.
func loadKEK(cfg config.Config) (*envelope.KEK, error) {
	if cfg.KEKFile != "" {
		return envelope.Load(cfg.KEKFile)
	}
	return envelope.LoadOrCreate(kekPath(cfg))
}

// kekPath is the configured key-encryption key file.
func kekPath(cfg config.Config) string {
	if cfg.KEKFile != "" {
		return cfg.KEKFile
	}
	return filepath.Join(cfg.DataDir, "kek.json")
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := config.Default()
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	db, err := openDB(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	fmt.Fprintln(stdout, "migrations applied")
	return nil
}
