package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
)

// httpCmd: vmagent http [--timeout 5s] [--cacert FILE] URL: one GET from
// the root namespace (with --cacert, an https URL's server is verified
// against the CA certificates in FILE, e.g. a pod's service-account
// ca.crt); it fails only when there is no HTTP answer at all.
func httpCmd(args []string, stdout io.Writer) error {
	fs := newFlags("http")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout of the request")
	caFile := fs.String("cacert", "", "PEM file of the CA certificates that verify an https server")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: http: %w", errUsage, err)
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
	client := http.DefaultClient
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("http: no certificate in %s", *caFile)
		}
		client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	}
	resp, err := client.Do(req)
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
