package config

import (
	"fmt"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"
)

// NewLogger builds the agent's logger from --log-level and --log-format.
func NewLogger(level, format string) (*zap.Logger, error) {
	zc, err := loggerConfig(level, format)
	if err != nil {
		return nil, err
	}
	return zc.Build()
}

// loggerConfig is the configuration NewLogger builds: zap's production
// one (JSON on standard error) or its development one (console), at level,
// unsampled.
func loggerConfig(level, format string) (zap.Config, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return zap.Config{}, fmt.Errorf("--log-level: %w", err)
	}
	var zc zap.Config
	switch format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
	default:
		return zap.Config{}, fmt.Errorf("--log-format: %q is neither json nor console", format)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	return zc, nil
}

// BridgeKlog sends klog's lines, those of client-go and apimachinery
// (reflectors, the event broadcaster, API warnings), through log, so that
// the agent writes one format: klog would write its own text among the
// JSON lines. klog's logger is a process global of klog's, which no
// caller can avoid; a command calls BridgeKlog once, right after building
// its logger, and ipvs-proxy keeps no global of its own for it.
//
// The logger is contextual (klog.FromContext and klog.Background return
// it). klog's -v stays 0, which klog checks before the bridge sees a line:
// client-go's V(n) lines are not written, its info, warning and error
// lines are (warnings at info, errors at error); klog.Flush syncs log.
func BridgeKlog(log *zap.Logger) {
	klog.SetLoggerWithOptions(zapr.NewLogger(log), klog.ContextualLogger(true),
		klog.FlushLogger(func() { _ = log.Sync() }))
}

// LogWarning logs the warning about the config file, if any: that its
// form is deprecated, and the settings it sets that ipvs-proxy ignores.
func LogWarning(log *zap.Logger, warn *Warning) {
	if warn == nil {
		return
	}
	if warn.Deprecated != "" {
		log.Warn("the config file's form is deprecated", zap.String("file", warn.File), zap.String("deprecation", warn.Deprecated))
	}
	if len(warn.Ignored) > 0 {
		log.Warn("ignoring the settings of the config file that ipvs-proxy does not support", zap.String("file", warn.File),
			zap.String("kind", warn.Kind), zap.Strings("ignored", warn.Ignored))
	}
}
