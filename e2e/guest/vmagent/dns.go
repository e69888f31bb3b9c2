package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

// dnsCmd asks a DNS server for a name's A record --n times, --interval
// apart, each query from a new socket (a new source port, as a stub
// resolver does), and prints a nettest.HitResult as hit does: the answers
// counted by the address answered ("rcode:NAME" when the server answered
// without one), a query without an answer within --timeout a failure.
func dnsCmd(args []string, stdout io.Writer) error {
	var c nettest.HitConfig
	fs := newFlags("dns")
	fs.StringVar(&c.Addr, "server", "", "HOST:PORT of the DNS server")
	name := fs.String("name", "", "the name to ask for (fully qualified, with its final dot)")
	fs.IntVar(&c.N, "n", 1, "number of queries")
	fs.DurationVar(&c.Timeout, "timeout", nettest.DefaultHitTimeout, "timeout of one query")
	fs.DurationVar(&c.Interval, "interval", 0, "pause between two queries")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.Addr == "" || *name == "" {
		return fmt.Errorf("%w: dns: need --server and --name", errUsage)
	}
	q, err := dnsmessage.NewName(*name)
	if err != nil {
		return fmt.Errorf("%w: dns: --name %q: %w", errUsage, *name, err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	var id uint16
	res, err := nettest.Repeat(ctx, c, func(ctx context.Context, timeout time.Duration) (string, error) {
		id++
		return askDNS(ctx, c.Addr, q, id, timeout)
	})
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

// askDNS sends one query for q's A record from a new UDP socket and
// returns the first address answered, or "rcode:CODE".
func askDNS(ctx context.Context, server string, q dnsmessage.Name, id uint16, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg := dnsmessage.Message{Header: dnsmessage.Header{ID: id, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: q, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}}}
	query, err := msg.Pack()
	if err != nil {
		return "", fmt.Errorf("pack a query: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", server)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return "", err
	}
	if _, err := conn.Write(query); err != nil {
		return "", err
	}
	buf := make([]byte, 1500)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return "", err
		}
		var answer dnsmessage.Message
		if answer.Unpack(buf[:n]) != nil || answer.ID != id {
			continue // not the answer to this query
		}
		for _, a := range answer.Answers {
			if r, ok := a.Body.(*dnsmessage.AResource); ok {
				return net.IP(r.A[:]).String(), nil
			}
		}
		return "rcode:" + answer.RCode.String(), nil
	}
}
