package store

import (
	"time"

	"github.com/uptrace/bun"
)

// Run statuses (ADR 0033).
const (
	RunRunning   = "running"
	RunPaused    = "paused"
	RunCompleted = "completed"
	RunFailed    = "failed"
	RunCancelled = "cancelled"
)

// Run is one background run (internal/runs): a daemon run followed by the
// gateway with no caller attached.
type Run struct {
	bun.BaseModel `bun:"table:runs"`

	ID             string `bun:"id,pk"`
	OrganizationID string `bun:"organization_id,notnull"`
	WorkspaceID    string `bun:"workspace_id,notnull"`
	InternID       string `bun:"intern_id,notnull"`
	SessionID      string `bun:"session_id,notnull"`
	// DaemonRunID is the daemon's id of the run (Attach).
	DaemonRunID string `bun:"daemon_run_id,notnull"`
	// Caller is who started it, as turn.Caller names them.
	Caller string `bun:"caller,notnull"`
	Status string `bun:"status,notnull"`
	// Pending is the tool call a paused run waits on (JSON), Error the
	// error object of a failed or cancelled run (JSON), Usage the usage of
	// a completed one (JSON); "" when none.
	Pending string `bun:"pending,notnull"`
	Error   string `bun:"error,notnull"`
	Usage   string `bun:"usage,notnull"`
	// CompletionID and CompletionCreated are the id and created of the
	// chunks of the stream being recorded (each start and each answer is
	// one chat response).
	CompletionID      string `bun:"completion_id,notnull"`
	CompletionCreated int64  `bun:"completion_created,notnull"`
	// DaemonSeq is the daemon event whose chunks were recorded last: a
	// gateway that takes the run over attaches after it.
	DaemonSeq int64 `bun:"daemon_seq,notnull"`
	// LastSeq is the seq of the last stored chunk, EventBytes their size.
	LastSeq         int64 `bun:"last_seq,notnull"`
	EventBytes      int64 `bun:"event_bytes,notnull"`
	EventsTruncated bool  `bun:"events_truncated,notnull"`
	CancelRequested bool  `bun:"cancel_requested,notnull"`
	// SegmentOpen: the chunks of the response being recorded have begun
	// (its role chunk is stored) and not ended (no final chunk yet).
	SegmentOpen bool `bun:"segment_open,notnull"`
	// PauseDeadline is when a paused run's question expires.
	PauseDeadline *time.Time `bun:"pause_deadline"`
	// LeaseOwner is the gateway process recording the run until
	// LeaseUntil; a running run whose lease passed is taken over.
	LeaseOwner string     `bun:"lease_owner,notnull"`
	LeaseUntil *time.Time `bun:"lease_until"`
	CreatedAt  time.Time  `bun:"created_at,notnull"`
	UpdatedAt  time.Time  `bun:"updated_at,notnull"`
	EndedAt    *time.Time `bun:"ended_at"`
}

// RunEvent is one stored chunk of a run: the JSON of its SSE data line.
type RunEvent struct {
	bun.BaseModel `bun:"table:run_events"`

	RunID string `bun:"run_id,pk"`
	Seq   int64  `bun:"seq,pk"`
	Data  string `bun:"data,notnull"`
}
