package kubetest

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// follow lists and then watches until ctx ends, listing again whenever the watch breaks.
// client-go's informers do this too, but their retry backoff grows to 30 s; tests stop the
// API server for a moment and expect things to carry on as soon as it is back.
func follow[T any](ctx context.Context,
	list func(context.Context, metav1.ListOptions) ([]T, string, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
	synced func(items []T),
	event func(watch.EventType, *T),
) {
	for ctx.Err() == nil {
		items, rv, err := list(ctx, metav1.ListOptions{})
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		synced(items)
		w, err := watchFn(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		for e := range w.ResultChan() {
			if e.Type == watch.Error {
				break // e.g. 410 Gone: the list above starts afresh
			}
			if obj, ok := any(e.Object).(*T); ok {
				event(e.Type, obj)
			}
		}
		w.Stop()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
