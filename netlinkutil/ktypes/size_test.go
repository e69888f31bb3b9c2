package ktypes

import (
	"testing"
	"unsafe"
)

// TestRealServerSize: a real server is held once per endpoint in every
// plan and in the view of the kernel (250,000 of each at 5,000 Services of
// 50 endpoints): a field added or widened shows here first.
func TestRealServerSize(t *testing.T) {
	if s := unsafe.Sizeof(RealServer{}); s > 48 {
		t.Errorf("RealServer takes %d bytes, want 48 at most", s)
	}
}
