package tunnelend

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"
)

// Cleanup removes every tunnel end this package may have programmed with
// cfg (`ipvs-proxy cleanup`): our chains and jumps, the rule and the
// routes of cfg.Table, and the GUE ports named (fou ports carry no owner:
// only the caller knows which are the agent's). tunl0 and its rp_filter
// stay: other software (Calico's IPIP) may use the device.
func Cleanup(ctx context.Context, cfg Config, k Kernel, guePorts []uint16, log *zap.Logger) error {
	t, err := New(cfg, k, log)
	if err != nil {
		return err
	}
	var errs []error
	if len(guePorts) > 0 { // none named: fou need not even be loaded
		if open, err := k.Net.FouPorts(); err != nil {
			errs = append(errs, fmt.Errorf("list GUE ports: %w", err))
		} else {
			for _, p := range guePorts {
				if slices.Contains(open, p) {
					t.addedFou[p] = true
				}
			}
		}
	}
	errs = append(errs, t.apply(ctx, state{tables: tables(t.marks, t.cfg.MTU, nil)}, true))
	return errors.Join(errs...)
}
