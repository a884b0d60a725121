// Command cohort is the Cohort service: the gateway (serve), the operator's
// CLI (admin) and the database migrator (migrate).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/buildinfo"
	"github.com/cohort-dev/cohort/internal/config"
	"github.com/cohort-dev/cohort/internal/interncmd"
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
	err := interncmd.Profiled(func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0) // -h asked for the flags, and got them
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cohort:", err)
		os.Exit(1)
	}
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
		return interncmd.Intern(ctx, args[1:], stdout, stderr, runJailedDaemon)
	case "agent":
		return interncmd.Agent(ctx, args[1:], os.Stdin, stdout, stderr)
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

// The helpers cmd/cohort shares with cmd/cohort-intern.
var (
	env          = config.Env
	envBool      = config.EnvBool
	envDuration  = config.EnvDuration
	splitList    = config.SplitList
	newLogger    = interncmd.NewLogger
	startTracing = interncmd.StartTracing
	limitFlags   = interncmd.LimitFlags
)

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
