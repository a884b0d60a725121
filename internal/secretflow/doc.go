// Package secretflow holds the end-to-end tests of a secret on its way out:
// a chat turn through the gateway, the intern daemon and the built-in agent
// with a scripted model, an http_request tool call with a placeholder, the
// vault's release through the gateway, and the request reaching a stand-in
// for the secret's bound host. It has no code of its own.
package secretflow
