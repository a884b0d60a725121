package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/cohort-dev/cohort/internal/testing/storetest"
	"github.com/cohort-dev/cohort/internal/testing/testutil"
)

// A background turn survives its gateway: started through one gateway
// process that is then killed (SIGKILL) mid-run, it is taken over by the
// gateway started next on the same database, which attaches to the
// intern's daemon after the last recorded event. The run completes, and
// its events read back whole: numbered without gap or repeat, one role
// chunk, one end. On SQLite and PostgreSQL.
func TestBackgroundRunSurvivesGatewayKill(t *testing.T) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			url := ""
			if db == "postgres" {
				url = storetest.PostgresURL(t)
			}
			flags := []string{"--background-lease", "2s"}
			c, gw := newCluster(t, url, flags...)
			d := c.Daemon(t, c.Demo, nil)
			res := chat(t, gw, c.WK, d.id, user("$ sleep 3; echo survived", `"background":true`))
			raw, _ := io.ReadAll(res.Body)
			var run map[string]any
			if err := json.Unmarshal(raw, &run); err != nil || res.StatusCode != 202 || run["status"] != "running" {
				t.Fatalf("start: %d %s", res.StatusCode, raw)
			}
			id := run["id"].(string)
			gw.Kill()
			<-gw.done

			gw = c.Gateway(t, append(flags, "--log-level", "info")...)
			testutil.Eventually(t, wait, "the run completes after the restart", func() bool {
				run = getRun(t, gw, c.WK, d.id, id)
				return run["status"] != "running"
			})
			if run["status"] != "completed" {
				t.Fatalf("after the restart: %v", run)
			}
			if !strings.Contains(gw.stderr.String(), "took over a background run") {
				t.Fatalf("the new gateway did not take the run over:\n%s", gw.stderr)
			}
			evs := runEvents(t, gw, c.WK, d.id, id, 0)
			roles, finals, text := readRun(t, evs)
			if roles != 1 || finals != 1 || !strings.Contains(text, "survived") || int64(run["last_event_id"].(float64)) != int64(len(evs)) {
				t.Fatalf("%d role chunks, %d final chunks, text %q, %d events for last_event_id %v", roles, finals, text, len(evs), run["last_event_id"])
			}
			// Resumed from the middle, the same events follow.
			if rest := runEvents(t, gw, c.WK, d.id, id, 2); len(rest) != len(evs)-2 || rest[0] != evs[2] {
				t.Fatalf("resume after 2: %v", rest)
			}
		})
	}
}

func getRun(t *testing.T, gw *proc, key, intern, id string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", gw.URL+"/api/v1/interns/"+intern+"/runs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || res.StatusCode != 200 {
		t.Fatalf("get run: %d %s", res.StatusCode, raw)
	}
	return m
}

// readRun checks a run's events are numbered 1.. without gap or repeat
// and counts its role chunks and ends, with its text.
func readRun(t *testing.T, evs []runEvent) (roles, finals int, text string) {
	t.Helper()
	for i, ev := range evs {
		if ev.id != int64(i+1) {
			t.Fatalf("event %d has id %d: a gap or a repeat", i, ev.id)
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Role    *string `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(ev.data), &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.Choices) == 0 {
			finals++
			continue
		}
		if ch.Choices[0].Delta.Role != nil {
			roles++
		}
		if c := ch.Choices[0].Delta.Content; c != nil {
			text += *c
		}
	}
	return roles, finals, text
}

type runEvent struct {
	id   int64
	data string
}

// runEvents reads a run's event stream to its [DONE].
func runEvents(t *testing.T, gw *proc, key, intern, id string, after int64) []runEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", gw.URL+"/api/v1/interns/"+intern+"/runs/"+id+"/events?after="+strconv.FormatInt(after, 10), nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out []runEvent
	var cur runEvent
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.id, _ = strconv.ParseInt(line[4:], 10, 64)
		case line == "data: [DONE]":
			return out
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
			out = append(out, cur)
			cur = runEvent{}
		}
	}
	t.Fatalf("events ended without [DONE]: %d events, %v", len(out), sc.Err())
	return nil
}
