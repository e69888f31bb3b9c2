package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// CompactEtcd compacts etcd's history up to its current revision (and
// waits for the physical compaction), through etcd's JSON gateway: any
// watch that resumes from an older resource version then gets "too old
// resource version" and must list again. It returns the revision.
func (cp *ControlPlane) CompactEtcd(ctx context.Context) (int64, error) {
	// A range read of one key gives the store's current revision.
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := cp.etcdPost(ctx, "/v3/kv/range", map[string]any{"key": "Lw==", "limit": 1}, &rng); err != nil {
		return 0, err
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("etcd: revision %q: %w", rng.Header.Revision, err)
	}
	if err := cp.etcdPost(ctx, "/v3/kv/compaction", map[string]any{"revision": rev, "physical": true}, nil); err != nil {
		return 0, err
	}
	cp.logf("control plane: etcd compacted up to revision %d", rev)
	return rev, nil
}

func (cp *ControlPlane) etcdPost(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cp.etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("etcd %s: %w: %s", path, err, b)
		}
	}
	return nil
}
