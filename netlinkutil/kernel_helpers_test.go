package netlinkutil

import (
	"errors"

	"golang.org/x/sys/unix"
)

// missingFeature reports whether err is the kernel saying "not supported".
func missingFeature(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) ||
		errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT)
}
