// Package lb is hostaccel's nftables L4 load balancer.
package lb

// Config is the `loadBalancer` section of the config file.
type Config struct {
	Services []Service `json:"services,omitempty"`
}

// Service is one load-balanced service.
type Service struct {
	Name string `json:"name"`
}

// Validate checks the section; errors name the field (loadBalancer.services[i]...).
func (c *Config) Validate() []error { return nil }
