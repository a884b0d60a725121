package kubepods

import (
	"context"
	"net/http"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// kubeAPI reaches the four kinds of object the provisioner uses in the
// interns' namespace. It is a rest.RESTClient with a scheme of only core/v1
// and coordination/v1, not client-go's typed clientset: the clientset's
// scheme registers every API group at init, which cost every process of
// this binary (each intern's daemon and agent too) 2.2 MB more heap and
// 5 ms more start (GODEBUG=inittrace=1; ADR 0010).
type kubeAPI struct {
	core, coord rest.Interface
	ns          string
	params      runtime.ParameterCodec
}

// newKubeAPI reaches ns through cfg; observe, when set, is told of every
// request (internal/metrics counts them).
func newKubeAPI(cfg *rest.Config, ns string, observe func(verb, resource string, code int)) (*kubeAPI, error) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := coordv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	mk := func(apiPath string, gv schema.GroupVersion) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		if observe != nil {
			c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return observed{rt, observe} })
		}
		c.APIPath, c.GroupVersion = apiPath, &gv
		c.NegotiatedSerializer, c.ContentType = codecs, runtime.ContentTypeJSON
		return rest.RESTClientFor(c)
	}
	core, err := mk("/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	coord, err := mk("/apis", coordv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &kubeAPI{core: core, coord: coord, ns: ns, params: runtime.NewParameterCodec(scheme)}, nil
}

func (a *kubeAPI) pods() objects[corev1.Pod, *corev1.Pod] {
	return objects[corev1.Pod, *corev1.Pod]{a, a.core, "pods"}
}
func (a *kubeAPI) secrets() objects[corev1.Secret, *corev1.Secret] {
	return objects[corev1.Secret, *corev1.Secret]{a, a.core, "secrets"}
}
func (a *kubeAPI) claims() objects[corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaim] {
	return objects[corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaim]{a, a.core, "persistentvolumeclaims"}
}
func (a *kubeAPI) leases() objects[coordv1.Lease, *coordv1.Lease] {
	return objects[coordv1.Lease, *coordv1.Lease]{a, a.coord, "leases"}
}

// object is a pointer to one API object type.
type object[T any] interface {
	*T
	runtime.Object
	metav1.Object
}

// objects is one resource in the interns' namespace, with the calls of a
// typed clientset's (the options are the same types).
type objects[T any, P object[T]] struct {
	a        *kubeAPI
	c        rest.Interface
	resource string
}

func (o objects[T, P]) Get(ctx context.Context, name string, opts metav1.GetOptions) (P, error) {
	out := P(new(T))
	err := o.c.Get().Namespace(o.a.ns).Resource(o.resource).Name(name).VersionedParams(&opts, o.a.params).Do(ctx).Into(out)
	return out, err
}

func (o objects[T, P]) Create(ctx context.Context, obj P, opts metav1.CreateOptions) (P, error) {
	out := P(new(T))
	err := o.c.Post().Namespace(o.a.ns).Resource(o.resource).VersionedParams(&opts, o.a.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (o objects[T, P]) Update(ctx context.Context, obj P, opts metav1.UpdateOptions) (P, error) {
	out := P(new(T))
	err := o.c.Put().Namespace(o.a.ns).Resource(o.resource).Name(obj.GetName()).VersionedParams(&opts, o.a.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

func (o objects[T, P]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return o.c.Delete().Namespace(o.a.ns).Resource(o.resource).Name(name).Body(&opts).Do(ctx).Error()
}

// informer caches the resource's objects matching selector, kept current
// by a watch (client-go relists after errors, an API server away included).
func (o objects[T, P]) informer(selector string, exemplar P) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return o.c.Get().Namespace(o.a.ns).Resource(o.resource).VersionedParams(&opts, o.a.params).Do(ctx).Get()
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector, opts.Watch = selector, true
			return o.c.Get().Namespace(o.a.ns).Resource(o.resource).VersionedParams(&opts, o.a.params).Watch(ctx)
		},
	}
	return cache.NewSharedIndexInformer(lw, exemplar, 10*time.Minute, cache.Indexers{})
}

// observed tells of each request to the API: its verb (LIST and WATCH
// apart from GET) and resource, and the status (0: no answer).
type observed struct {
	rt      http.RoundTripper
	observe func(verb, resource string, code int)
}

func (o observed) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := o.rt.RoundTrip(r)
	// …/namespaces/<ns>/<resource>[/<name>[/<subresource>]]
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	resource, named := "", false
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			resource, named = parts[i+2], i+3 < len(parts)
			break
		}
	}
	verb := r.Method
	switch {
	case verb == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "WATCH"
	case verb == http.MethodGet && !named:
		verb = "LIST"
	}
	code := 0
	if err == nil {
		code = res.StatusCode
	}
	o.observe(verb, resource, code)
	return res, err
}
