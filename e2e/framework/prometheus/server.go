package prometheus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/repo"
	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm"
)

// Where the server lives in the guest, and where it listens there (the
// guest's loopback: the test reaches it through the guest agent).
const (
	GuestBinary     = "/usr/local/bin/prometheus"
	GuestConfig     = "/etc/prometheus/prometheus.yml"
	GuestRules      = "/etc/prometheus/rules.yml"
	GuestKubeconfig = "/etc/prometheus/kubeconfig"
	guestData       = "/var/lib/prometheus"
	listen          = "127.0.0.1:9090"
)

// BuildTags keep only the kubernetes service discovery (Prometheus's
// plugins/ mechanism): the bed needs no other, and the binary is smaller.
const BuildTags = "remove_all_sd,enable_kubernetes_sd"

// Build builds the Prometheus server of the module pinned in
// e2e/tools/prometheus (the version promtool comes from) into bin/ of
// the repository, static and stripped for the guest, and returns its
// path. The Go build cache makes a second build a link.
func Build(ctx context.Context) (string, error) {
	root, err := repo.Root()
	if err != nil {
		return "", fmt.Errorf("prometheus: %w", err)
	}
	out := filepath.Join(root, "bin", "prometheus")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-tags", BuildTags, "-ldflags=-s -w", "-o", out,
		"github.com/prometheus/prometheus/cmd/prometheus")
	cmd.Dir = filepath.Join(root, "e2e", "tools", "prometheus")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("prometheus: build: %w\n%s", err, b)
	}
	return out, nil
}

// Options start a server.
type Options struct {
	Binary     string // the host's binary (Build)
	Config     Config // its rule_files are set to GuestRules when Rules is
	Rules      []byte // a rule file, or none
	Kubeconfig []byte // written to GuestKubeconfig, for kubernetes_sd
}

// Server is a Prometheus server running in a VM.
type Server struct {
	proc *vm.Proc
	http *http.Client
}

// Start copies the server into v, writes its files, starts it and waits
// (up to 3 minutes, under emulation) until it is ready.
func Start(ctx context.Context, v *vm.VM, o Options) (*Server, error) {
	if o.Rules != nil {
		o.Config.RuleFiles = []string{GuestRules}
		if err := v.WriteFile(ctx, GuestRules, o.Rules, 0o644); err != nil {
			return nil, fmt.Errorf("prometheus: %w", err)
		}
	}
	cfg, err := o.Config.YAML()
	if err != nil {
		return nil, err
	}
	for path, data := range map[string][]byte{GuestConfig: cfg, GuestKubeconfig: o.Kubeconfig} {
		if err := v.WriteFile(ctx, path, data, 0o600); err != nil {
			return nil, fmt.Errorf("prometheus: %w", err)
		}
	}
	if err := v.CopyFile(ctx, o.Binary, GuestBinary); err != nil {
		return nil, fmt.Errorf("prometheus: %w", err)
	}
	proc, err := v.Start(ctx, GuestBinary, "--config.file="+GuestConfig, "--storage.tsdb.path="+guestData,
		"--web.listen-address="+listen, "--log.level=info")
	if err != nil {
		return nil, fmt.Errorf("prometheus: start: %w", err)
	}
	s := &Server{proc: proc, http: &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return v.Dial(ctx, listen) },
	}}}
	if err := s.waitReady(ctx, 3*time.Minute); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) waitReady(ctx context.Context, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://prometheus/-/ready", nil)
		if err != nil {
			return fmt.Errorf("prometheus: %w", err)
		}
		resp, err := s.http.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus: not ready after %s (%w): %s", limit, err, tail(s.Log(), 3000))
		case <-time.After(time.Second):
		}
	}
}

// Log is the server's output so far.
func (s *Server) Log() string { return s.proc.Output() }

// Close stops the server.
func (s *Server) Close() { _ = s.proc.Stop() }

// get calls the HTTP API's path with query and decodes its data into out.
func (s *Server) get(ctx context.Context, path string, query url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://prometheus"+path+"?"+query.Encode(), nil)
	if err != nil {
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("prometheus: %s: %d %.300q: %w", path, resp.StatusCode, b, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("prometheus: %s %s: %s", path, query.Encode(), env.Error)
	}
	if err := json.NewDecoder(bytes.NewReader(env.Data)).Decode(out); err != nil {
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	return nil
}

// Target is an active target of /api/v1/targets.
type Target struct {
	Labels             map[string]string `json:"labels"`
	ScrapePool         string            `json:"scrapePool"`
	ScrapeURL          string            `json:"scrapeUrl"`
	Health             string            `json:"health"`
	LastError          string            `json:"lastError"`
	LastScrapeDuration float64           `json:"lastScrapeDuration"`
}

// Targets are the server's active targets.
func (s *Server) Targets(ctx context.Context) ([]Target, error) {
	var d struct {
		Active []Target `json:"activeTargets"`
	}
	err := s.get(ctx, "/api/v1/targets", url.Values{"state": {"active"}}, &d)
	return d.Active, err
}

// Series is one series of a query's result: an instant query's sample
// (Value) or a range query's (Values).
type Series struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
	Values [][]any           `json:"values"`
}

// Numbers counts the series' samples that are numbers (not NaN).
func (s Series) Numbers() int {
	n := 0
	samples := s.Values
	if s.Value != nil {
		samples = append(samples, s.Value)
	}
	for _, v := range samples {
		if len(v) != 2 {
			continue
		}
		str, _ := v[1].(string)
		if f, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(f) {
			n++
		}
	}
	return n
}

// QueryRange evaluates expr from start to end every step, as a Grafana
// time series panel does.
func (s *Server) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	var d struct {
		Result []Series `json:"result"`
	}
	err := s.get(ctx, "/api/v1/query_range", url.Values{"query": {expr}, "start": {unix(start)}, "end": {unix(end)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}, &d)
	return d.Result, err
}

// Query evaluates expr now.
func (s *Server) Query(ctx context.Context, expr string) ([]Series, error) {
	var d struct {
		Result []Series `json:"result"`
	}
	err := s.get(ctx, "/api/v1/query", url.Values{"query": {expr}}, &d)
	return d.Result, err
}

// Rule is a rule of /api/v1/rules.
type Rule struct {
	Name      string `json:"name"`
	Type      string `json:"type"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"`
}

// Rules are the server's loaded rules, group by group, with the file
// each group came from.
func (s *Server) Rules(ctx context.Context) (map[string][]Rule, error) {
	var d struct {
		Groups []struct {
			File  string `json:"file"`
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := s.get(ctx, "/api/v1/rules", nil, &d); err != nil {
		return nil, err
	}
	out := map[string][]Rule{}
	for _, g := range d.Groups {
		out[g.File] = append(out[g.File], g.Rules...)
	}
	return out, nil
}

func unix(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
