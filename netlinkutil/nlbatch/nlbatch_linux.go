// Package nlbatch sends many netlink requests on one socket without waiting
// for each answer, and maps the kernel's answers back to the requests.
//
// The kernel handles the requests of one sendmsg call in order and answers
// each of them before the call returns (generic netlink and nfnetlink run
// their handlers synchronously), so a window of requests costs one system
// call to send and, since only errors and the window's last request are
// acknowledged, one read per error plus one. Every request has its own
// sequence number, so that an error names the request it answers.
//
// The socket's receive buffer bounds a window: an answer that does not fit
// is dropped by the kernel, which then reports ENOBUFS. Windows are sized so
// that even an error for every request fits (the buffer is enlarged where
// the process may), and should answers be lost anyway, the requests whose
// outcome is unknown get ErrUnknown instead of a guess.
package nlbatch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Message is one request: its netlink message type, extra header flags
// (NLM_F_REQUEST is always set; NLM_F_ACK is managed by Exchange) and the
// payload that follows the netlink header.
type Message struct {
	Type  uint16
	Flags uint16
	Data  []byte
}

// Result is the kernel's answer to one Message.
type Result struct {
	// Err is nil when the kernel applied the request, a syscall.Errno
	// when it refused it, ErrUnknown when its answer was lost, or the
	// error of the send that carried it (then it was not applied).
	Err error
	// Echo is what the kernel's error message carried after the error
	// code: the request's header, and its payload when the sender of the
	// error included it (ipset does, to name a failing entry).
	Echo []byte
}

// Socket is a netlink socket for batches. Its methods are safe for
// concurrent use (they serialize).
type Socket struct {
	mu       sync.Mutex
	fd       int
	seq      uint32
	rcvbuf   int // bytes the kernel lets queue for us
	maxChunk int // bytes per sendmsg
	buf      []byte
}

const (
	// wantBuf is the receive and send buffer size asked for.
	wantBuf = 8 << 20
	// answerOverhead approximates the buffer space an answer takes in the
	// kernel's accounting beyond its bytes (socket buffer bookkeeping).
	answerOverhead = 1024
	// chunkBytes bounds one sendmsg call.
	chunkBytes = 64 << 10
)

// Open opens a netlink socket of the protocol (unix.NETLINK_GENERIC,
// unix.NETLINK_NETFILTER...) in the network namespace of the calling
// thread.
func Open(proto int) (*Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("open netlink socket (protocol %d): %w", proto, err)
	}
	s := &Socket{fd: fd, buf: make([]byte, 256<<10)}
	if err := s.setup(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return s, nil
}

func (s *Socket) setup() error {
	if err := unix.Bind(s.fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("bind netlink socket: %w", err)
	}
	// Errors carry the failed request's header only, not the whole
	// request (ipset's own errors still carry it).
	if err := unix.SetsockoptInt(s.fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
		return fmt.Errorf("netlink socket: set NETLINK_CAP_ACK: %w", err)
	}
	// Larger buffers where the process may (CAP_NET_ADMIN), else up to
	// the system's limit (net.core.rmem_max, wmem_max).
	for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
		if unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, o[0], wantBuf) != nil {
			_ = unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, o[1], wantBuf) // best effort: the default serves too
		}
	}
	rcv, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		return fmt.Errorf("netlink socket: read SO_RCVBUF: %w", err)
	}
	snd, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		return fmt.Errorf("netlink socket: read SO_SNDBUF: %w", err)
	}
	s.rcvbuf = rcv
	// The kernel refuses a send larger than its send buffer.
	s.maxChunk = min(chunkBytes, snd/2)
	return nil
}

// Close closes the socket.
func (s *Socket) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

// window is how many bytes of answers one window may leave queued.
func (s *Socket) window() int { return s.rcvbuf / 2 }

// Exchange sends msgs in order and returns one Result per message. Messages
// go out in windows of many, each message with its own sequence number; a
// window's answers are read after it was sent whole.
func (s *Socket) Exchange(msgs []Message) []Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := make([]Result, len(msgs))
	if s.fd < 0 {
		for i := range res {
			res[i].Err = errors.New("netlink socket closed")
		}
		return res
	}
	for start := 0; start < len(msgs); {
		end, cost := start, 0
		for end < len(msgs) && (end == start || cost+answerCost(msgs[end]) <= s.window()) {
			cost += answerCost(msgs[end])
			end++
		}
		s.window1(msgs[start:end], res[start:end])
		start = end
	}
	return res
}

func answerCost(m Message) int { return answerOverhead + unix.NLMSG_HDRLEN + len(m.Data) }

// window1 sends one window, in chunks of one sendmsg call each, and reads
// its answers. The last message of each chunk asks for an acknowledgement:
// once it is there, a message of the chunk with no error answer was
// applied.
func (s *Socket) window1(msgs []Message, res []Result) {
	first := s.seq + 1
	s.seq += uint32(len(msgs))
	acked := make([]bool, len(msgs)) // messages that asked for an ack
	var chunk []byte
	sent := 0 // messages sent
	for i, m := range msgs {
		flags := m.Flags | unix.NLM_F_REQUEST
		size := nlmsgAlign(unix.NLMSG_HDRLEN + len(m.Data))
		if i == len(msgs)-1 || (i+1 < len(msgs) && len(chunk)+size+nlmsgAlign(unix.NLMSG_HDRLEN+len(msgs[i+1].Data)) > s.maxChunk) {
			flags |= unix.NLM_F_ACK
			acked[i] = true
		}
		chunk = appendHeader(chunk, uint32(unix.NLMSG_HDRLEN+len(m.Data)), m.Type, flags, first+uint32(i))
		chunk = append(chunk, m.Data...)
		for len(chunk)%unix.NLMSG_ALIGNTO != 0 {
			chunk = append(chunk, 0)
		}
		if !acked[i] {
			continue
		}
		if err := unix.Sendto(s.fd, chunk, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			// Nothing of this chunk reached the kernel, nor will the rest.
			for j := sent; j < len(msgs); j++ {
				res[j].Err = fmt.Errorf("send netlink requests: %w", err)
			}
			break
		}
		sent = i + 1
		chunk = chunk[:0]
	}
	if sent > 0 {
		s.collect(first, res[:sent], acked[:sent])
	}
}

// collect reads the answers to the sent messages whose first sequence
// number is first. The kernel answered them all before the sends returned,
// so reading never waits: what is not queued was lost. acked marks the
// messages that asked for an acknowledgement (each chunk's last).
func (s *Socket) collect(first uint32, res []Result, acked []bool) {
	answered := make([]bool, len(res))
	overrun := false
	for {
		n, _, err := unix.Recvfrom(s.fd, s.buf, unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOBUFS) {
			overrun = true
			continue
		}
		if err != nil { // EAGAIN: nothing left
			break
		}
		msgs, perr := syscall.ParseNetlinkMessage(s.buf[:n])
		if perr != nil {
			overrun = true // a damaged read: trust nothing unanswered
			continue
		}
		for _, m := range msgs {
			i := int(m.Header.Seq - first)
			if m.Header.Type != unix.NLMSG_ERROR || m.Header.Seq < first || i >= len(res) || len(m.Data) < 4 {
				continue // not an answer to this window (a late one of an old window)
			}
			answered[i] = true
			if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
				res[i].Err = syscall.Errno(-code)
				res[i].Echo = append([]byte(nil), m.Data[4:]...)
			}
		}
	}
	// Walk each chunk back from its acknowledgement: without one (or
	// after an overrun), unanswered messages have an unknown outcome.
	ackSeen := false
	for i := len(res) - 1; i >= 0; i-- {
		if acked[i] {
			ackSeen = answered[i]
		}
		if !answered[i] && (overrun || !ackSeen) {
			res[i].Err = ErrUnknown
		}
	}
}

func nlmsgAlign(n int) int { return (n + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1) }

func appendHeader(b []byte, length uint32, typ, flags uint16, seq uint32) []byte {
	b = binary.NativeEndian.AppendUint32(b, length)
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	return binary.NativeEndian.AppendUint32(b, 0) // port id: the kernel
}

// Attrs builds netlink attributes (type-length-value, 4-byte aligned).
type Attrs []byte

// Bytes appends an attribute holding v.
func (a Attrs) Bytes(typ uint16, v []byte) Attrs {
	a = binary.NativeEndian.AppendUint16(a, uint16(unix.NLA_HDRLEN+len(v)))
	a = binary.NativeEndian.AppendUint16(a, typ)
	a = append(a, v...)
	for len(a)%unix.NLA_ALIGNTO != 0 {
		a = append(a, 0)
	}
	return a
}

// U8 appends a one-byte attribute.
func (a Attrs) U8(typ uint16, v uint8) Attrs { return a.Bytes(typ, []byte{v}) }

// U16 appends a host-order 16-bit attribute.
func (a Attrs) U16(typ uint16, v uint16) Attrs {
	return a.Bytes(typ, binary.NativeEndian.AppendUint16(nil, v))
}

// U32 appends a host-order 32-bit attribute.
func (a Attrs) U32(typ uint16, v uint32) Attrs {
	return a.Bytes(typ, binary.NativeEndian.AppendUint32(nil, v))
}

// BE16 appends a network-order 16-bit attribute (a caller that must say
// so sets NLA_F_NET_BYTEORDER in typ).
func (a Attrs) BE16(typ uint16, v uint16) Attrs {
	return a.Bytes(typ, binary.BigEndian.AppendUint16(nil, v))
}

// String appends a NUL-terminated string.
func (a Attrs) String(typ uint16, v string) Attrs { return a.Bytes(typ, append([]byte(v), 0)) }

// Nest appends a nested attribute (NLA_F_NESTED set) whose contents fill
// appends.
func (a Attrs) Nest(typ uint16, fill func(Attrs) Attrs) Attrs {
	start := len(a)
	a = append(a, 0, 0, 0, 0)
	a = fill(a)
	binary.NativeEndian.PutUint16(a[start:], uint16(len(a)-start))
	binary.NativeEndian.PutUint16(a[start+2:], typ|unix.NLA_F_NESTED)
	return a
}
