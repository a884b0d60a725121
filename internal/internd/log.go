package internd

import (
	"net/http"

	"google.golang.org/protobuf/proto"

	pb "github.com/cohort-dev/cohort/gen/cohort/internd/v1"
	"github.com/cohort-dev/cohort/internal/apierr"
)

// eventLog is a run's numbered events, kept up to a retention bound (a
// count and a byte budget). The oldest events go first; the last one is
// always kept so a consumer can see how the run stands. It is guarded by
// its run's mutex.
type eventLog struct {
	events    []*pb.RunEvent
	sizes     []int
	first     uint64 // seq of events[0]
	next      uint64 // seq the next event gets
	bytes     int
	maxEvents int
	maxBytes  int
	// pin is the attached consumer's next seq (0: none). Events it has not
	// read yet are kept beyond the bound, up to four times it, so a live
	// consumer that keeps up never loses events to a fast agent.
	pin uint64
	// fetched is the first seq the attached consumer has not taken yet.
	fetched uint64
	// wake is closed (and replaced) on every append, so waiting consumers
	// need no per-consumer bookkeeping.
	wake chan struct{}
}

func newEventLog(maxEvents, maxBytes int) eventLog {
	return eventLog{first: 1, next: 1, maxEvents: maxEvents, maxBytes: maxBytes, wake: make(chan struct{})}
}

// add numbers ev, appends it and trims the log to its bound.
func (l *eventLog) add(runID string, ev *pb.RunEvent) uint64 {
	ev.Seq, ev.RunId = l.next, runID
	l.next++
	n := proto.Size(ev)
	l.events = append(l.events, ev)
	l.sizes = append(l.sizes, n)
	l.bytes += n
	l.trim()
	close(l.wake)
	l.wake = make(chan struct{})
	return ev.Seq
}

// maxMerged bounds the text one coalesced delta carries.
const maxMerged = 4096

// merge appends a text or reasoning delta to the last event when that event
// is the same kind of delta with the same model and the attached consumer
// has not taken it yet: a consumer that lags gets fewer, larger deltas
// instead of paying per-message costs for each of the agent's chunks.
// Events already handed out are never changed.
func (l *eventLog) merge(text, model string, thought bool) bool {
	if l.pin == 0 || len(l.events) == 0 {
		return false
	}
	last := l.events[len(l.events)-1]
	if last.GetSeq() < l.fetched || last.GetModel() != model {
		return false
	}
	var cur *string
	switch {
	case thought && last.GetReasoning() != nil:
		cur = &last.GetReasoning().Text
	case !thought && last.GetText() != nil:
		cur = &last.GetText().Text
	default:
		return false
	}
	if len(*cur)+len(text) > maxMerged {
		return false
	}
	*cur += text
	n := proto.Size(last)
	l.bytes += n - l.sizes[len(l.sizes)-1]
	l.sizes[len(l.sizes)-1] = n
	return true
}

// trim drops the oldest events beyond the bound.
func (l *eventLog) trim() {
	over := func(k int) bool {
		return (l.maxEvents > 0 && len(l.events) > k*l.maxEvents) || (l.maxBytes > 0 && l.bytes > k*l.maxBytes)
	}
	for len(l.events) > 1 && over(1) && (l.pin == 0 || l.first < l.pin || over(4)) {
		l.bytes -= l.sizes[0]
		l.events[0] = nil
		l.events, l.sizes = l.events[1:], l.sizes[1:]
		l.first++
	}
}

// since returns the retained events with seq >= from (a shared slice the
// caller must not modify) and the channel closed on the next append. A
// position already dropped is attachment_failed 410; one not yet produced
// beyond the next event is a bad request.
func (l *eventLog) since(from uint64) ([]*pb.RunEvent, <-chan struct{}, error) {
	if from == 0 {
		from = 1
	}
	if from < l.first {
		return nil, nil, apierr.New(http.StatusGone, apierr.ReasonAttachmentFailed,
			"the run produced more output than the intern retains: events before %d were dropped", l.first)
	}
	if from > l.next {
		return nil, nil, apierr.BadRequest("from_seq %d is beyond the run's next event %d", from, l.next)
	}
	i := int(from - l.first)
	return l.events[i:len(l.events):len(l.events)], l.wake, nil
}

// forget drops every event: later attachments get 410.
func (l *eventLog) forget() {
	l.events, l.sizes, l.bytes, l.first = nil, nil, 0, l.next
}
