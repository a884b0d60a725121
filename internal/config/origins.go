package config

import (
	"fmt"
	"net/url"
	"strings"
)

// ParseOrigins checks the origins of --cors-allow-origins
// ("https://app.example.com", scheme and host, with a port if not the
// default) and returns them in the form browsers send in Origin.
func ParseOrigins(list []string) ([]string, error) {
	var out []string
	for _, o := range list {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("%q is not an origin: want scheme://host[:port], such as https://app.example.com", o)
		}
		out = append(out, strings.ToLower(u.Scheme+"://"+u.Host))
	}
	return out, nil
}
