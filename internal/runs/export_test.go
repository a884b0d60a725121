package runs

import "context"

// Look is one pass of Run (its queries, nothing taken over when every run
// is held), for BenchmarkRunsLook.
func (m *Manager) Look(ctx context.Context) {
	m.stayAlive(ctx)
	m.takeOver(ctx)
	m.expirePaused(ctx)
	m.nextExpiry(ctx)
}

// Owner is this process's lease name.
func (m *Manager) Owner() string { return m.owner }
