package testenv

import (
	"strings"
	"sync"
)

type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// take returns what was written and starts over: a test that sends
// thousands of requests keeps its log from growing with them.
func (l *lockedWriter) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.w.String()
	l.w = &strings.Builder{}
	return s
}
