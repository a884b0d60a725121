// Command receiver is a Cohort webhook receiver: it checks each delivery's
// Standard Webhooks signature and age, then prints the event. Run it with
// the endpoint's secret:
//
//	WEBHOOK_SECRET=whsec_… go run ./docs/examples/webhooks/go
//
// It listens on $LISTEN (default 127.0.0.1:8000) and answers 204 to a
// verified delivery, 401 to anything else.
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// tolerance is how old (or early) a delivery may be: older ones are
// refused as possible replays.
const tolerance = 5 * time.Minute

// verify checks the webhook-signature header against the secret: HMAC-SHA256
// over "id.timestamp.body", base64, any of the space-separated "v1,…"
// entries (two during a secret rotation).
func verify(secret string, h http.Header, body []byte, now time.Time) error {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return errors.New("the secret is not whsec_ followed by base64")
	}
	id, ts := h.Get("webhook-id"), h.Get("webhook-timestamp")
	sec, err := strconv.ParseInt(ts, 10, 64)
	if id == "" || err != nil {
		return errors.New("missing webhook-id or webhook-timestamp")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return errors.New("timestamp outside the tolerance")
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(h.Get("webhook-signature")) {
		version, b64, _ := strings.Cut(sig, ",")
		got, err := base64.StdEncoding.DecodeString(b64)
		if version == "v1" && err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

func main() {
	secret := os.Getenv("WEBHOOK_SECRET")
	if secret == "" {
		log.Fatal("set WEBHOOK_SECRET to the endpoint's secret (whsec_…)")
	}
	addr := os.Getenv("LISTEN")
	if addr == "" {
		addr = "127.0.0.1:8000"
	}
	http.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "unreadable body", http.StatusBadRequest)
			return
		}
		if err := verify(secret, r.Header, body, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		// webhook-id is the same on every retry: a receiver that must act
		// once keeps the ids it has handled. Data is the run object as GET
		// …/runs/{id} returns it: on run.paused, answer data.pending_interaction.id
		// (the tool_call_id) in data.session_id, on POST
		// /api/v1/interns/{data.intern_id}/chat/completions (docs/webhooks.md).
		fmt.Printf("%s %s %s\n", r.Header.Get("webhook-id"), ev.Type, ev.Data)
		w.WriteHeader(http.StatusNoContent)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, nil))
}
