// Package deploy holds the Kubernetes manifests an operator applies with
// `kubectl apply -k deploy/` (docs/kubernetes.md). It has no Go code: its
// tests read exactly the files kustomization.yaml lists, check the gateway's
// Pod template statically, then apply everything to a real kube-apiserver
// (internal/testing/kubetest): server-side dry run, a real apply, the docs'
// examples, Pod Security, and what the gateway's ServiceAccount may and may
// not do.
package deploy
