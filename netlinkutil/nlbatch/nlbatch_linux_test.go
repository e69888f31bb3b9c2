package nlbatch

import (
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// getFamily is a generic netlink request for a family by name: the kernel
// answers a known one with a message of its own and an unknown one with
// ENOENT, on any kernel (this machine's too).
func getFamily(name string) Message {
	b := Attrs{unix.CTRL_CMD_GETFAMILY, 1, 0, 0}.String(unix.CTRL_ATTR_FAMILY_NAME, name)
	return Message{Type: unix.GENL_ID_CTRL, Data: b}
}

func open(t *testing.T) *Socket {
	t.Helper()
	s, err := Open(unix.NETLINK_GENERIC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestExchange sends thousands of requests, some refused, in one call
// (several windows and sends): each refused one gets its own error, the
// others none.
func TestExchange(t *testing.T) {
	s := open(t)
	s.maxChunk = 4 << 10 // many sends per window
	var msgs []Message
	for i := range 3000 {
		if i%7 == 3 {
			msgs = append(msgs, getFamily(fmt.Sprintf("nosuch%d", i)))
		} else {
			msgs = append(msgs, getFamily("nlctrl"))
		}
	}
	for i, r := range s.Exchange(msgs) {
		if refused := i%7 == 3; refused != errors.Is(r.Err, unix.ENOENT) || (!refused && r.Err != nil) {
			t.Fatalf("request %d: %v, want ENOENT: %v", i, r.Err, refused)
		}
	}
}

// TestExchangeOverrun: when answers overflow the receive buffer, the
// requests whose answer was lost get ErrUnknown, never a success; those
// answered keep their error.
func TestExchangeOverrun(t *testing.T) {
	s := open(t)
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096); err != nil {
		t.Fatal(err)
	}
	s.rcvbuf = 1 << 30 // windows far larger than the buffer: answers get dropped
	var msgs []Message
	for i := range 500 {
		msgs = append(msgs, getFamily(fmt.Sprintf("nosuch%d", i)))
	}
	lost := 0
	for i, r := range s.Exchange(msgs) {
		switch {
		case errors.Is(r.Err, ErrUnknown):
			lost++
		case !errors.Is(r.Err, unix.ENOENT):
			t.Fatalf("request %d: %v, want ENOENT or ErrUnknown", i, r.Err)
		}
	}
	if lost == 0 {
		t.Errorf("no answer was lost with a 4 KiB buffer")
	}
	// The socket serves on afterwards.
	if r := s.Exchange([]Message{getFamily("nlctrl"), getFamily("nosuch")}); r[0].Err != nil || !errors.Is(r[1].Err, unix.ENOENT) {
		t.Errorf("after an overrun: %v, %v", r[0].Err, r[1].Err)
	}
}
