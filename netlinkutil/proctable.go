package netlinkutil

import (
	"bufio"
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
	out := map[ktypes.VSKey][]ktypes.RealServer{}
	var cur ktypes.VSKey
	have := false // cur is a virtual server whose destinations are read
	for n := 1; ; n++ {
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("line %d too long", n)
		}
		if len(line) > 0 {
			if perr := parseProcLine(string(line), out, &cur, &have); perr != nil {
				return nil, fmt.Errorf("line %d %q: %w", n, strings.TrimSpace(string(line)), perr)
			}
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func parseProcLine(line string, out map[ktypes.VSKey][]ktypes.RealServer, cur *ktypes.VSKey, have *bool) error {
	f := strings.Fields(line)
	if len(f) == 0 {
		return nil
	}
	if f[0] == "->" {
		if !*have { // the header, or a fwmark service's destination
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
			n, err := strconv.ParseInt(f[3+i], 10, 32)
			if err != nil {
				return fmt.Errorf("destination counters: %w", err)
			}
			nums[i] = int32(n)
		}
		out[*cur] = append(out[*cur], ktypes.RealServer{RSKey: ktypes.RSKey{Address: a, Port: port},
			Forward: procForward(f[2]), Weight: nums[0], ActiveConns: nums[1], InactiveConns: nums[2]})
		return nil
	}
	proto, ok := procProtocols[f[0]]
	if !ok || len(f) < 2 { // the header lines, fwmark services
		*have = false
		return nil
	}
	a, port, err := parseProcAddrPort(f[1])
	if err != nil {
		return err
	}
	// A record shown twice (the file is read in pieces) counts once.
	*cur, *have = ktypes.VSKey{Address: a, Protocol: proto, Port: port}, true
	out[*cur] = []ktypes.RealServer{}
	return nil
}

// parseProcAddrPort parses "0A60000A:0050" or "[fd00:...:0010]:0050".
func parseProcAddrPort(s string) (netip.Addr, uint16, error) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return netip.Addr{}, 0, fmt.Errorf("address %q has no port", s)
	}
	port, err := strconv.ParseUint(s[i+1:], 16, 16)
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("port of %q: %w", s, err)
	}
	host := s[:i]
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		return a, uint16(port), err
	}
	b, err := hex.DecodeString(host)
	if err != nil || len(b) != 4 {
		return netip.Addr{}, 0, fmt.Errorf("address %q is not 8 hexadecimal digits", host)
	}
	return netip.AddrFrom4([4]byte(b)), uint16(port), nil
}
