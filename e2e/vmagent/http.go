package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
)

// httpCmd: vmagent http [--timeout 5s] URL: one GET from the root
// namespace; it fails only when there is no HTTP answer at all.
func httpCmd(args []string, stdout io.Writer) error {
	fs := newFlags("http")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout of the request")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: http: %v", errUsage, err)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: http: want one URL", errUsage)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fs.Arg(0), nil)
	if err != nil {
		return fmt.Errorf("http: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("http: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("http: read body of %s: %w", fs.Arg(0), err)
	}
	return json.NewEncoder(stdout).Encode(agentapi.HTTPResult{Status: resp.StatusCode, Body: string(body)})
}
