package webhooks

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/uptrace/bun"

	"github.com/cohort-dev/cohort/internal/store"
)

// Event is the body of every delivery (the Standard Webhooks payload
// shape): the event type, when the status changed, and the run as the
// runs API returns it.
type Event struct {
	Type      string          `json:"type"`
	Timestamp string          `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// RunChanged enqueues eventType about run for every enabled endpoint of
// the workspace that takes it: one outbox row each, written through db,
// the transaction that records the run's status, so the event is sent if
// and only if that change commits. run is the run object as the runs API
// returns it (a paused run carries its pending interaction).
func RunChanged(ctx context.Context, db bun.IDB, workspaceID, eventType string, run json.RawMessage) error {
	return enqueue(ctx, db, time.Now(), workspaceID, eventType, run)
}

// RunChanged is the package's RunChanged with the service's clock.
func (s *Service) RunChanged(ctx context.Context, db bun.IDB, workspaceID, eventType string, run json.RawMessage) error {
	return enqueue(ctx, db, s.now(), workspaceID, eventType, run)
}

func enqueue(ctx context.Context, db bun.IDB, now time.Time, workspaceID, eventType string, run json.RawMessage) error {
	if !slices.Contains(EventTypes, eventType) {
		return fmt.Errorf("webhooks: %q is not an event type", eventType)
	}
	if !json.Valid(run) {
		return fmt.Errorf("webhooks: the %s run is not JSON", eventType)
	}
	var eps []store.WebhookEndpoint
	if err := db.NewSelect().Model(&eps).Column("id", "events").
		Where("workspace_id = ? AND enabled = ?", workspaceID, true).Scan(ctx); err != nil {
		return fmt.Errorf("webhooks: endpoints of workspace %s: %w", workspaceID, err)
	}
	now = store.Now(func() time.Time { return now })
	var rows []store.WebhookDelivery
	var body []byte
	for _, e := range eps {
		var events []string
		if json.Unmarshal([]byte(e.Events), &events) != nil || !slices.Contains(events, eventType) {
			continue
		}
		if body == nil {
			b, err := json.Marshal(Event{Type: eventType, Timestamp: now.Format(time.RFC3339Nano), Data: run})
			if err != nil {
				return err
			}
			body = b
		}
		id, err := newMessageID()
		if err != nil {
			return err
		}
		rows = append(rows, store.WebhookDelivery{ID: id, EndpointID: e.ID, WorkspaceID: workspaceID,
			EventType: eventType, Payload: string(body), Status: store.WebhookPending, NextAttemptAt: now, CreatedAt: now})
	}
	if len(rows) == 0 {
		return nil
	}
	if _, err := db.NewInsert().Model(&rows).Exec(ctx); err != nil {
		return fmt.Errorf("webhooks: enqueue %s: %w", eventType, err)
	}
	return nil
}

// newMessageID is a delivery's webhook-id: "msg_" and 128 random bits.
func newMessageID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "msg_" + base64.RawURLEncoding.EncodeToString(b), nil
}
