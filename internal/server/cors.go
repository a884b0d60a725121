package server

import (
	"net/http"
	"strings"

	connectcors "connectrpc.com/cors"
)

// CORS for browser clients served from other origins: only the API (under
// /api/) takes part, and only for the origins the operator listed
// (--cors-allow-origins). Credentials are bearer tokens the page sends in
// Authorization, never cookies, so no Access-Control-Allow-Credentials.
var (
	corsMethods = strings.Join(append(connectcors.AllowedMethods(), http.MethodPut, http.MethodDelete), ", ")
	corsHeaders = strings.Join(append(connectcors.AllowedHeaders(),
		"Authorization", "Connect-Accept-Encoding", "Connect-Content-Encoding"), ", ")
	// Retry-After comes with 429 and 503; the rest are Connect's and
	// gRPC-web's.
	corsExposed = strings.Join(append(connectcors.ExposedHeaders(), "Retry-After"), ", ")
)

// corsMaxAge is how long a browser may cache a preflight's answer (seconds;
// Chromium caps it at 7200).
const corsMaxAge = "7200"

// cors answers preflights under /api/ and marks the API's answers to the
// listed origins readable; a request from any other origin gets no CORS
// header at all, and its preflight a 403.
func cors(origins []string, next http.Handler) http.Handler {
	if len(origins) == 0 {
		return next
	}
	allowed := map[string]bool{}
	for _, o := range origins {
		allowed[o] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			next.ServeHTTP(w, r)
			return
		}
		// Every API answer depends on Origin once any origin is allowed.
		h := w.Header()
		h.Add("Vary", "Origin")
		origin := r.Header.Get("Origin")
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		ok := allowed[strings.ToLower(origin)]
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Add("Vary", "Access-Control-Request-Method")
			h.Add("Vary", "Access-Control-Request-Headers")
			if !ok {
				http.Error(w, "origin not allowed by --cors-allow-origins", http.StatusForbidden)
				return
			}
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Allow-Methods", corsMethods)
			h.Set("Access-Control-Allow-Headers", corsHeaders)
			h.Set("Access-Control-Max-Age", corsMaxAge)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if ok {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", corsExposed)
		}
		next.ServeHTTP(w, r)
	})
}
