package nlbatch

import "errors"

// ErrUnknown is the outcome of a request whose answer was lost (the receive
// buffer overflowed): the kernel may or may not have applied it.
var ErrUnknown = errors.New("netlink answer lost (receive buffer overrun): outcome unknown")
