package web_test

import (
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/cohort-dev/cohort/internal/testing/browsertest"
	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testenv"
)

// TestInternsTableFitsADesktop: at 1280 and 1920 px wide the interns table
// shows every column with no scrolling: its region does not scroll sideways
// and each row's Created, Suspend and Delete are inside the viewport.
func TestInternsTableFitsADesktop(t *testing.T) {
	t.Parallel()
	e := testenv.New(t, storetest.SQLite(t))
	for _, width := range []int{1280, 1920} {
		b := browsertest.New(t, width, 800)
		signIn(t, b, e.HTTP.URL+"/", e.ManagementKey)
		b.Do(t,
			chromedp.Navigate(e.HTTP.URL+"/#/interns"),
			chromedp.WaitVisible(css("table button[aria-label^='Delete ']")),
		)
		cut := browsertest.Get(t, b, chromedp.Evaluate[[]string](`(() => {
			const wrap = document.querySelector(".table-wrap");
			const box = wrap.getBoundingClientRect();
			const out = [];
			if (wrap.scrollWidth > wrap.clientWidth) out.push("table scrolls sideways: " + wrap.scrollWidth + " > " + wrap.clientWidth);
			const sel = "td:nth-child(6), th:nth-child(6), button[aria-label^='Suspend '], button[aria-label^='Delete ']";
			for (const el of document.querySelectorAll(sel)) {
				const r = el.getBoundingClientRect();
				if (r.width === 0 || r.right > Math.min(box.right, window.innerWidth) + 0.5 || r.left < box.left - 0.5)
					out.push((el.getAttribute("aria-label") || el.textContent) + " at " + r.left + ".." + r.right + ", region " + box.left + ".." + box.right);
			}
			return out;
		})()`))
		if len(cut) > 0 {
			t.Errorf("%d px: cut off: %v", width, cut)
		}
		if width == 1280 {
			screenshot(t, b, "console-interns-1280.png")
		}
		b.NoErrors(t)
	}
}
