package tunnelend

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"go.uber.org/zap"
)

// recoverNumbers reads the endpoint numbers that the mark rules in the
// kernel carry (an agent before this one wrote them), so that a restart
// keeps each endpoint's mark: renumbered, the mangle and nat tables would
// disagree between their two transactions. Rules of another mask are
// ignored; a read that fails leaves the numbering to number().
func (t *TunnelEnd) recoverNumbers() {
	saved, err := t.k.Tables.Save(context.Background())
	if err != nil {
		t.log.Info("cannot read the tunnel ends' marks: endpoints are numbered afresh", zap.Error(err))
		return
	}
	mangle := saved["mangle"]
	if mangle == nil {
		return
	}
	taken := map[int]bool{}
	for _, r := range mangle.Rules[chainMark] {
		addr, id, ok := t.parseMarkRule(r)
		if !ok || taken[id] {
			continue
		}
		if _, dup := t.ids[addr]; !dup {
			t.ids[addr], taken[id] = id, true
		}
	}
}

// parseMarkRule reads "-A IPVSD-PREROUTING -d <addr>/32 ... -j MARK
// --set-xmark <mark>/<mask>".
func (t *TunnelEnd) parseMarkRule(r string) (addr netip.Addr, id int, ok bool) {
	f := strings.Fields(r)
	if len(f) < 6 || f[2] != "-d" || f[len(f)-2] != "--set-xmark" {
		return netip.Addr{}, 0, false
	}
	p, err := netip.ParsePrefix(f[3])
	if err != nil || !p.Addr().Is4() {
		return netip.Addr{}, 0, false
	}
	var mark, mask uint32
	if _, err := fmt.Sscanf(f[len(f)-1], "0x%x/0x%x", &mark, &mask); err != nil || mask != t.marks.mask || mark&t.marks.flag == 0 {
		return netip.Addr{}, 0, false
	}
	id = int((mark & t.marks.ids) >> t.marks.shift)
	return p.Addr(), id, id > 0
}
