package config

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// NewLogger builds the agent's logger from --log-level and --log-format.
func NewLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var zc zap.Config
	switch format {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("--log-format: %q is neither json nor console", format)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	return zc.Build()
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
