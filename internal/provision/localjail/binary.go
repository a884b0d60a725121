package localjail

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/cohort-dev/cohort/internal/buildinfo"
	"github.com/cohort-dev/cohort/internal/config"
)

// InternBinaryName is the small binary of an intern's jail
// (cmd/cohort-intern), looked for beside the gateway's executable.
const InternBinaryName = "cohort-intern"

// InternBinary is the binary local interns run from (the jail's init, the
// daemon, the built-in agent): setting (--intern-binary) when set, else
// cohort-intern beside self (the gateway's executable) when it exists,
// else self. A binary other than self is used only if its `version`
// prints the gateway's own build (buildinfo): any other answer, or none,
// is logged and self is used, so a stale cohort-intern left beside an
// upgraded gateway never runs. The choice is logged.
func InternBinary(ctx context.Context, setting, self string, log *slog.Logger) string {
	bin := setting
	if bin == "" {
		bin = filepath.Join(filepath.Dir(self), InternBinaryName)
		if _, err := os.Stat(bin); err != nil {
			log.Info("interns run from the gateway's own binary", "binary", self, "why", InternBinaryName+" is not beside it")
			return self
		}
	}
	if abs, err := filepath.Abs(bin); err == nil {
		bin = abs
	}
	if err := sameBuild(ctx, bin); err != nil {
		log.Warn("interns run from the gateway's own binary instead of "+config.Setting("intern-binary"),
			"binary", self, "refused", bin, "err", err)
		return self
	}
	log.Info("interns run from their own binary", "binary", bin)
	return bin
}

// sameBuild checks that bin reports the running build.
func sameBuild(ctx context.Context, bin string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out []byte
	var err error
	for try := 0; ; try++ {
		cmd := exec.CommandContext(ctx, bin, "version")
		cmd.Env = []string{}
		out, err = cmd.Output()
		// ETXTBSY: the binary was just written, and a child forked
		// meanwhile by another goroutine of this process (or the writer)
		// still holds it open for writing until its exec; it passes.
		if !errors.Is(err, syscall.ETXTBSY) || try == 20 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return fmt.Errorf("%s version: %w", bin, err)
	}
	want := buildinfo.Get().String()
	if got := strings.TrimSpace(string(out)); got != want {
		return fmt.Errorf("it is another build: %q, the gateway is %q", got, want)
	}
	return nil
}
