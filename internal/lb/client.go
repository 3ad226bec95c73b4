package lb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Client talks to a running agent's API.
type Client struct {
	HTTP *http.Client
	Base string // http://lb (unix socket) or http://host:port
	Key  string
}

// NewClient returns a client for a unix socket, or for a TCP address with a key.
func NewClient(socket, address, key string) *Client {
	if address != "" {
		return &Client{HTTP: &http.Client{Timeout: clientTimeout()}, Base: "http://" + address, Key: key}
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	return &Client{HTTP: &http.Client{Transport: tr, Timeout: clientTimeout()}, Base: "http://lb"}
}

// Do sends a request with an optional body (a value sent as JSON, or []byte sent as is:
// YAML or JSON) and decodes the answer into out.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	payload, raw := body.([]byte)
	if !raw && body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Key != "" {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("load balancer API (is the agent running with a loadBalancer section?): %w", err)
	}
	defer resp.Body.Close()
	var answer bytes.Buffer
	if _, err := answer.ReadFrom(resp.Body); err != nil {
		return err
	}
	b := answer.Bytes()
	if resp.StatusCode >= 300 {
		var ae apiError
		if json.Unmarshal(b, &ae) == nil && len(ae.Errors) > 0 {
			return errors.New(strings.Join(ae.Errors, "\n"))
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// ServicePath and BackendPath build API paths.
func ServicePath(name string) string { return "/v1/services/" + url.PathEscape(name) }
func BackendPath(name, key string) string {
	return ServicePath(name) + "/backends/" + url.PathEscape(key)
}
