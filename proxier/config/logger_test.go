package config

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestBridgeKlog: after BridgeKlog, klog's lines (client-go's) come out
// as JSON lines of the agent's logger, at its level, with the caller
// that logged them; none in klog's own text.
func TestBridgeKlog(t *testing.T) {
	zc, err := loggerConfig("info", "json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "log")
	zc.OutputPaths, zc.ErrorOutputPaths = []string{path}, []string{path}
	log, err := zc.Build()
	if err != nil {
		t.Fatal(err)
	}
	BridgeKlog(log)
	t.Cleanup(klog.ClearLogger) // klog's logger is a process global

	klog.Info("from klog")
	klog.Warningf("a warning about %s", "something")
	klog.ErrorS(errors.New("boom"), "a structured error", "resource", "services")
	klog.V(1).Info("a verbose line") // klog's -v is 0
	klog.Background().V(1).Info("a verbose contextual line")
	klog.Background().Info("a contextual line", "key", "value")
	klog.Flush()

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	byMsg := map[string]map[string]any{}
	for _, l := range strings.Split(string(data), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a line that is not JSON: %q (%v)", l, err)
		}
		msg, _ := m["msg"].(string)
		byMsg[msg] = m
	}
	want := []struct {
		msg, level string
		fields     map[string]any
	}{
		{"from klog", "info", nil},
		{"a warning about something", "info", nil},
		{"a structured error", "error", map[string]any{"error": "boom", "resource": "services"}},
		{"a contextual line", "info", map[string]any{"key": "value"}},
	}
	for _, w := range want {
		m, ok := byMsg[w.msg]
		if !ok {
			t.Errorf("no JSON line with msg %q in:\n%s", w.msg, data)
			continue
		}
		if m["level"] != w.level {
			t.Errorf("%q: level %v, want %s", w.msg, m["level"], w.level)
		}
		if c, _ := m["caller"].(string); !strings.HasPrefix(c, "config/logger_test.go:") {
			t.Errorf("%q: caller %q, want this test's line", w.msg, c)
		}
		for k, v := range w.fields {
			if m[k] != v {
				t.Errorf("%q: %s = %v, want %v", w.msg, k, m[k], v)
			}
		}
	}
	for _, msg := range []string{"a verbose line", "a verbose contextual line"} {
		if _, ok := byMsg[msg]; ok {
			t.Errorf("%q logged at --log-level info", msg)
		}
	}
	if len(byMsg) != len(want) {
		t.Errorf("%d lines, want %d:\n%s", len(byMsg), len(want), data)
	}
}
