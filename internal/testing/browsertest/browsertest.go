// Package browsertest drives a real headless Chromium (Debian's) against a
// running console with chromedp, and collects every console error and
// uncaught exception so tests can assert there were none.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Browser is one headless Chromium tab.
type Browser struct {
	Ctx context.Context

	mu     sync.Mutex
	errors []string
	output tailBuffer
}

// tailBuffer keeps the last 16 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	const keep = 16 << 10
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > keep {
		w.buf = append(w.buf[:0], w.buf[len(w.buf)-keep:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}

// Path is the Chromium binary; COHORT_CHROMIUM overrides it.
func Path() string {
	if p := os.Getenv("COHORT_CHROMIUM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	return "/usr/bin/chromium"
}

// New starts Chromium for t. Without a Chromium the test is skipped loudly,
// or fails when COHORT_REQUIRE_BROWSER=1 (CI sets it).
func New(t *testing.T, width, height int) *Browser {
	t.Helper()
	if _, err := os.Stat(Path()); err != nil {
		if os.Getenv("COHORT_REQUIRE_BROWSER") == "1" {
			t.Fatalf("Chromium is required (COHORT_REQUIRE_BROWSER=1) but missing at %s", Path())
		}
		t.Skipf("!!! SKIPPING browser test: no Chromium at %s (apt-get install chromium)", Path())
	}
	b := &Browser{}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Path()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
		// Chromium's own output, for a failed test: a browser that died mid-test shows why
		// (chromedp's errors already carry its exit status: "browser process exited: …").
		chromedp.CombinedOutput(&b.output),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
		if t.Failed() {
			t.Logf("Chromium output (tail):\n%s", b.output.String())
		}
	})
	b.Ctx = ctx
	// Start the browser and its tab, then listen before anything loads.
	// Headless Chromium keeps windows at least 500 px wide, so the size is
	// emulated: a 390 px phone really gets a 390 px viewport.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				var parts []string
				for _, a := range ev.Args {
					parts = append(parts, string(a.Value))
				}
				b.addError("console.error: " + strings.Join(parts, " "))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			b.addError(fmt.Sprintf("exception: %s at %s:%d", msg, d.URL, d.LineNumber))
		case *log.EventEntryAdded:
			// Chrome logs every 4xx answer as a network error. Those are API
			// refusals the tests provoke and check on the page; everything
			// else (5xx, failed loads, script errors) counts.
			if ev.Entry.Level == log.EntryLevelError &&
				!(ev.Entry.Source == log.EntrySourceNetwork && strings.Contains(ev.Entry.Text, "status of 4")) {
				b.addError(fmt.Sprintf("log %s: %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		}
	})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	if _, err := chromedp.Call(ctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enable log domain: %v", err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enable runtime domain: %v", err)
	}
	return b
}

func (b *Browser) addError(s string) {
	b.mu.Lock()
	b.errors = append(b.errors, s)
	b.mu.Unlock()
}

// Errors returns the console errors and exceptions seen so far.
func (b *Browser) Errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// Do runs chromedp actions in the tab and fails t on error.
func (b *Browser) Do(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.Ctx, actions...); err != nil {
		t.Fatalf("browser: %v (console errors: %v)", err, b.Errors())
	}
}

// Get runs one action that returns a value, failing t on error.
func Get[T any](t *testing.T, b *Browser, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(b.Ctx, a)
	if err != nil {
		t.Fatalf("browser: %v (console errors: %v)", err, b.Errors())
	}
	return v
}

// Text returns the text of the first element matching a CSS selector.
func (b *Browser) Text(t *testing.T, css string) string {
	t.Helper()
	return Get(t, b, chromedp.Text(chromedp.CSS(css)))
}

// NoErrors fails t if the page logged an error or threw.
func (b *Browser) NoErrors(t *testing.T) {
	t.Helper()
	if errs := b.Errors(); len(errs) > 0 {
		t.Fatalf("the browser reported errors:\n%s", strings.Join(errs, "\n"))
	}
}
