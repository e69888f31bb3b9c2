package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// udpSendCmd sends datagrams of the given sizes, one after the other, on
// one connected UDP socket, and prints per datagram the answer or the error
// ("sent 1472: answer <line>" or "sent 1472: error <err>"): what happens to
// datagrams over a path's MTU. --pmtudisc do sets DF and makes the socket
// report what it learns (EMSGSIZE); the default is Linux's own (want).
func udpSendCmd(args []string, stdout io.Writer) error {
	fs := newFlags("udp-send")
	addr := fs.String("addr", "", "HOST:PORT to send to")
	sizes := fs.String("sizes", "100", "comma-separated datagram sizes in bytes (payload)")
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for each answer")
	pmtudisc := fs.String("pmtudisc", "want", "want (Linux's default), do (DF, errors reported) or dont")
	if err := parse(fs, args); err != nil {
		return err
	}
	mode, ok := map[string]int{"want": unix.IP_PMTUDISC_WANT, "do": unix.IP_PMTUDISC_DO, "dont": unix.IP_PMTUDISC_DONT}[*pmtudisc]
	if !ok || *addr == "" {
		return fmt.Errorf("%w: udp-send: need --addr and --pmtudisc want|do|dont", errUsage)
	}
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, mode) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("udp4", *addr)
	if err != nil {
		return fmt.Errorf("udp-send: %w", err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return fmt.Errorf("%w: udp-send: bad size %q", errUsage, s)
		}
		if _, err := conn.Write([]byte(strings.Repeat("d", n-1) + "\n")); err != nil {
			fmt.Fprintf(stdout, "sent %d: error %v\n", n, err)
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(*timeout))
		line, err := r.ReadString('\n')
		if err != nil {
			fmt.Fprintf(stdout, "sent %d: error %v\n", n, err)
			r.Reset(conn)
			continue
		}
		fmt.Fprintf(stdout, "sent %d: answer %s\n", n, strings.TrimSpace(line))
	}
	return nil
}
