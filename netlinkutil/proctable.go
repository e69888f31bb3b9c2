package netlinkutil

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/ktypes"
)

// procTable reads IPVS's table as text from /proc/net/ip_vs: every virtual
// server with its destinations, in one pass. Generic netlink has no dump of
// every destination (GET_DEST dumps one service's, and a socket runs one
// dump at a time: a second request while one runs gets EBUSY), so this file
// is the one read of all of them that the kernel offers. The file is opened
// once, in the network namespace of the thread that opens it, and read
// again from its start each time.
//
// Its one flaw: the kernel hands it out a page at a time and resumes each
// page by position, and (in Linux 6.1) the position counts the virtual
// servers of every network namespace while resuming counts only this
// one's: each page skips as many of this namespace's virtual servers as the
// last page passed of other namespaces'. So when other namespaces have
// virtual servers, up to as many of this one's may be left out of a table
// longer than a page (a virtual server comes whole with its destinations or
// not at all). Callers read those alone.
type procTable struct {
	mu sync.Mutex
	f  *os.File
	r  *bufio.Reader
}

// procTablePath is the calling thread's view (a thread switched into
// another network namespace sees that namespace's table).
const procTablePath = "/proc/thread-self/net/ip_vs"

func openProcTable() (*procTable, error) {
	f, err := os.Open(procTablePath)
	if err != nil {
		return nil, fmt.Errorf("open the IPVS table %s: %w", procTablePath, err)
	}
	return &procTable{f: f, r: bufio.NewReaderSize(f, 64<<10)}, nil
}

func (p *procTable) Close() { p.f.Close() }

// read returns the destinations of every virtual server that is not a
// fwmark one, by key; a virtual server without destinations has an empty
// entry. A destination's method is the file's (procForward): a tunnel's
// type and port are not in it.
func (p *procTable) read() (map[ktypes.VSKey][]ktypes.RealServer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read the IPVS table %s: %w", procTablePath, err)
	}
	p.r.Reset(p.f)
	out, err := parseProcTable(p.r)
	if err != nil {
		return nil, fmt.Errorf("read the IPVS table %s: %w", procTablePath, err)
	}
	return out, nil
}

var procProtocols = map[string]ktypes.Protocol{"TCP": ktypes.TCP, "UDP": ktypes.UDP, "SCTP": ktypes.SCTP}

// ParseProcTable parses a copy of /proc/net/ip_vs (as a test reads it in
// a VM with cat) as parseProcTable does.
func ParseProcTable(r io.Reader) (map[ktypes.VSKey][]ktypes.RealServer, error) {
	return parseProcTable(bufio.NewReaderSize(r, 64<<10))
}

// parseProcTable parses the format of the kernel's ip_vs_info_seq_show:
//
//	IP Virtual Server version 1.2.1 (size=4096)
//	Prot LocalAddress:Port Scheduler Flags
//	  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
//	TCP  0A60000A:0050 rr
//	  -> 0A000102:1F90      Masq    1      0          0
//	UDP  [fd00:0000:0000:0000:0000:0000:0000:0010]:0035 sh
//	FWM  00000001 rr
//
// (IPv4 addresses and ports in hexadecimal, IPv6 ones bracketed).
func parseProcTable(r *bufio.Reader) (map[ktypes.VSKey][]ktypes.RealServer, error) {
	p := procParser{out: map[ktypes.VSKey][]ktypes.RealServer{}}
	for n := 1; ; n++ {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("line %d too long", n)
		}
		if len(line) > 0 {
			if perr := p.line(line); perr != nil {
				return nil, fmt.Errorf("line %d %q: %w", n, strings.TrimSpace(string(line)), perr)
			}
		}
		if err == io.EOF {
			p.flush()
			return p.out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// procParser reads the table a line at a time. A virtual server's
// destinations gather in rss and go into out, in a list of their own
// size, when the next virtual server (or the end) comes.
type procParser struct {
	out  map[ktypes.VSKey][]ktypes.RealServer
	cur  ktypes.VSKey
	have bool // cur is a virtual server whose destinations are read
	rss  []ktypes.RealServer
}

// flush keeps cur's destinations (an empty list for none); a virtual
// server shown twice (the file is read in pieces) keeps the last.
func (p *procParser) flush() {
	if p.have {
		p.out[p.cur] = append(make([]ktypes.RealServer, 0, len(p.rss)), p.rss...)
	}
	p.rss = p.rss[:0]
}

func (p *procParser) line(line []byte) error {
	var buf [8][]byte
	f := procFields(line, buf[:0])
	if len(f) == 0 {
		return nil
	}
	if string(f[0]) == "->" {
		if !p.have { // the header, or a fwmark service's destination
			return nil
		}
		if len(f) < 6 {
			return fmt.Errorf("short destination line")
		}
		a, port, err := parseProcAddrPort(f[1])
		if err != nil {
			return err
		}
		var nums [3]int32
		for i := range nums {
			n, err := strconv.ParseInt(string(f[3+i]), 10, 32)
			if err != nil {
				return fmt.Errorf("destination counters: %w", err)
			}
			nums[i] = int32(n)
		}
		p.rss = append(p.rss, ktypes.RealServer{RSKey: ktypes.RSKey{Address: a, Port: port},
			Forward: procForward(string(f[2])), Weight: nums[0], ActiveConns: nums[1], InactiveConns: nums[2]})
		return nil
	}
	p.flush()
	proto, ok := procProtocols[string(f[0])]
	if !ok || len(f) < 2 { // the header lines, fwmark services
		p.have = false
		return nil
	}
	a, port, err := parseProcAddrPort(f[1])
	if err != nil {
		return err
	}
	p.cur, p.have = ktypes.VSKey{Address: a, Protocol: proto, Port: port}, true
	return nil
}

// procFields appends line's fields (split at spaces and tabs) to f, up to
// its capacity: a table line has at most 7 (a persistent service's). It
// allocates nothing: a table of 250,000 destinations is read whole at
// every periodic resync.
func procFields(line []byte, f [][]byte) [][]byte {
	for i := 0; i < len(line) && len(f) < cap(f); {
		for i < len(line) && isProcSpace(line[i]) {
			i++
		}
		j := i
		for j < len(line) && !isProcSpace(line[j]) {
			j++
		}
		if j > i {
			f = append(f, line[i:j])
		}
		i = j
	}
	return f
}

func isProcSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// parseProcAddrPort parses "0A60000A:0050" or "[fd00:...:0010]:0050".
func parseProcAddrPort(s []byte) (netip.Addr, uint16, error) {
	i := bytes.LastIndexByte(s, ':')
	if i < 0 {
		return netip.Addr{}, 0, fmt.Errorf("address %q has no port", s)
	}
	port, err := strconv.ParseUint(string(s[i+1:]), 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("port of %q: %w", s, err)
	}
	host := s[:i]
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		a, err := netip.ParseAddr(string(host[1 : len(host)-1]))
		return a, uint16(port), err
	}
	var b [4]byte
	if len(host) != 2*len(b) {
		return netip.Addr{}, 0, fmt.Errorf("address %q is not 8 hexadecimal digits", host)
	}
	if _, err := hex.Decode(b[:], host); err != nil {
		return netip.Addr{}, 0, fmt.Errorf("address %q is not 8 hexadecimal digits", host)
	}
	return netip.AddrFrom4(b), uint16(port), nil
}
