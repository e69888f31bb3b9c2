// Command vmagent runs inside the test VM. The VM's /init starts it as
//
//	vmagent agent --listen 10.0.2.15:7777 --token-file /etc/vmagent.token
//
// to serve the host's requests (run a command, start/read/stop a background
// process, write a file, power off; see package agentapi). Its other
// subcommands wrap package nettest so that host-side tests can build
// namespaces and drive traffic with plain commands:
//
//	vmagent netns add NAME --veth-host-addr 10.0.1.1/24 --addr 10.0.1.2/24 [--addr6 fd00:1::2/64 [--veth-host-addr6 fd00:1::1/64]]
//	vmagent netns del NAME
//	vmagent netns exec NAME -- COMMAND [ARG...]
//	vmagent serve [--netns NAME] --name be1 --port 8080 [--tcp] [--udp]
//	vmagent hit [--netns NAME] --proto tcp|udp --addr 10.96.0.10:80 [--n 6] [--timeout 2s]
//	vmagent hitports --addr 10.96.0.10:80 --first 40000 [--n 1000] [--timeout 2s]
//	vmagent hold [--netns NAME] [--proto tcp|udp] --addr 10.96.0.10:80 [--interval 200ms] [--timeout 2s] [--reset]
//	vmagent conntrack [--port 30080]
//	vmagent fou-add --port 6080 [--gue | --ipproto 4] [-6]
//	vmagent udp-send --addr 10.96.0.10:53 [--sizes 100,1472] [--timeout 2s] [--pmtudisc want|do|dont]
//	vmagent ctfill [--netns NAME] --addr 10.0.1.2:8080 [--n 1000] [--stop 20] [--timeout 1s] [--every 200ms]
//	vmagent connrate --addr 10.96.0.10:80 [--n 1000] [--workers 4] [--timeout 2s] [--limit 2m]
//	vmagent dns --server 10.96.0.10:53 --name kubernetes.default.svc.cluster.local. [--n 1] [--interval 0] [--timeout 2s]
//	vmagent ticks [--every 100ms] [--gap 1s]
//
// serve runs in the foreground (start it as a background process), prints
// "READY ..." once it listens, and serves TCP and UDP when neither --tcp
// nor --udp is given. hit prints a nettest.HitResult as JSON:
// {"answers":{"be1":3,"be2":3},"clients":{"10.0.3.2":6},"errors":[]}.
// hitports connects once from each of N source ports and prints which
// backend answered each port: {"answers":{"40000":"be1"},"errors":{}}.
// hold keeps one TCP connection (or one UDP flow: one socket, one source
// port) and asks on it until it is stopped, printing
// "answer N <backend> <client>" per answer, or "error ..." and exit status
// 1 when the flow fails. connrate opens N short connections (one request
// each), W at a time, and prints their rate and connect latencies as JSON
// (the bench's data path; run it in a namespace with netns exec). dns
// asks for a name's A record as hit connects and prints a HitResult whose
// answers are the addresses answered. ticks runs until stopped and prints
// the gaps between its wake-ups (when the VM stood still).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/vm/agentapi"
	"github.com/ipvs-proxy/ipvs-proxy/netlinkutil/nettest"
)

const usage = `usage:
  vmagent agent [--listen ADDR] [--token-file PATH]
  vmagent netns add NAME --veth-host-addr CIDR --addr CIDR [--addr6 CIDR [--veth-host-addr6 CIDR]]
  vmagent netns del NAME
  vmagent netns exec NAME -- COMMAND [ARG...]
  vmagent serve [--netns NAME] --name NAME --port PORT [--tcp] [--udp]
  vmagent hit [--netns NAME] --proto tcp|udp --addr HOST:PORT [--n N] [--timeout DURATION]
  vmagent hitports --addr HOST:PORT [--first PORT] [--n N] [--timeout DURATION]
  vmagent hold [--netns NAME] [--proto tcp|udp] --addr HOST:PORT [--interval DURATION] [--timeout DURATION] [--reset]
  vmagent download [--netns NAME] --addr HOST:PORT [--size BYTES] [--timeout DURATION]
  vmagent http [--timeout DURATION] [--cacert FILE] URL
  vmagent conntrack [--port PORT]
  vmagent fou-add --port PORT [--gue | --ipproto N] [-6]
  vmagent udp-send --addr HOST:PORT [--sizes N,N...] [--timeout DURATION] [--pmtudisc want|do|dont]
  vmagent ctfill [--netns NAME] --addr HOST:PORT [--n N] [--stop N] [--timeout DURATION] [--every DURATION]
  vmagent holds --addr HOST:PORT [--first PORT] [--n N] [--interval DURATION] [--timeout DURATION]
  vmagent ecmp-route --dst PREFIX --via ADDR,ADDR... [--weights N,N...] [--dev IFACE]
  vmagent connrate --addr HOST:PORT [--n N] [--workers N] [--timeout DURATION] [--limit DURATION]
  vmagent dns --server HOST:PORT --name NAME. [--n N] [--interval DURATION] [--timeout DURATION]
  vmagent ticks [--every DURATION] [--gap DURATION]
`

// errUsage makes main print the usage and exit with status 2.
var errUsage = errors.New("bad usage")

func main() {
	err := run(os.Args[1:], os.Stdout)
	if errors.Is(err, errUsage) {
		fmt.Fprintf(os.Stderr, "vmagent: %v\n%s", err, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmagent: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: no subcommand", errUsage)
	}
	switch args[0] {
	case "agent":
		return agentCmd(args[1:])
	case "netns":
		return netnsCmd(args[1:])
	case "serve":
		return serveCmd(args[1:], stdout)
	case "hit":
		return hitCmd(args[1:], stdout)
	case "hitports":
		return hitPortsCmd(args[1:], stdout)
	case "hold":
		return holdCmd(args[1:], stdout)
	case "download":
		return downloadCmd(args[1:], stdout)
	case "http":
		return httpCmd(args[1:], stdout)
	case "conntrack":
		return conntrackCmd(args[1:], stdout)
	case "fou-add":
		return fouAddCmd(args[1:])
	case "udp-send":
		return udpSendCmd(args[1:], stdout)
	case "ctfill":
		return ctFillCmd(args[1:], stdout)
	case "holds":
		return holdsCmd(args[1:], stdout)
	case "ecmp-route":
		return ecmpRouteCmd(args[1:])
	case "connrate":
		return connRateCmd(args[1:], stdout)
	case "dns":
		return dnsCmd(args[1:], stdout)
	case "ticks":
		return ticksCmd(args[1:], stdout)
	}
	return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
}

func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %s: %w", errUsage, fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s: unexpected arguments %q", errUsage, fs.Name(), fs.Args())
	}
	return nil
}

func agentCmd(args []string) error {
	fs := newFlags("agent")
	listen := fs.String("listen", fmt.Sprintf("%s:%d", agentapi.GuestAddr, agentapi.Port), "address to serve on")
	tokenFile := fs.String("token-file", agentapi.TokenPath, "file holding the bearer token")
	if err := parse(fs, args); err != nil {
		return err
	}
	return runAgent(*listen, *tokenFile)
}

// prefixFlag is a netip.Prefix flag that keeps the host bits (10.0.1.2/24).
type prefixFlag struct{ p *netip.Prefix }

func (f prefixFlag) String() string {
	if f.p == nil || !f.p.IsValid() {
		return ""
	}
	return f.p.String()
}

func (f prefixFlag) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return err
	}
	*f.p = p
	return nil
}

func netnsCmd(args []string) error {
	if len(args) < 2 {
		return fmt.Errorf("%w: netns: need add|del|exec NAME", errUsage)
	}
	verb, name, rest := args[0], args[1], args[2:]
	switch verb {
	case "add":
		var c nettest.NetnsConfig
		fs := newFlags("netns add")
		fs.Var(prefixFlag{&c.HostAddr}, "veth-host-addr", "root-side veth address, the namespace's gateway (10.0.1.1/24)")
		fs.Var(prefixFlag{&c.Addr}, "addr", "namespace address (10.0.1.2/24)")
		fs.Var(prefixFlag{&c.HostAddr6}, "veth-host-addr6", "root-side IPv6 veth address (default: the first of --addr6's prefix)")
		fs.Var(prefixFlag{&c.Addr6}, "addr6", "namespace IPv6 address")
		if err := parse(fs, rest); err != nil {
			return err
		}
		return nettest.AddNetns(name, c)
	case "del":
		if len(rest) > 0 {
			return fmt.Errorf("%w: netns del: unexpected arguments %q", errUsage, rest)
		}
		return nettest.DelNetns(name)
	case "exec":
		if len(rest) > 0 && rest[0] == "--" {
			rest = rest[1:]
		}
		if len(rest) == 0 {
			return fmt.Errorf("%w: netns exec: no command", errUsage)
		}
		return execIn(name, rest)
	}
	return fmt.Errorf("%w: netns: unknown verb %q", errUsage, verb)
}

// execIn replaces this process with argv, running in the named namespace
// (like `ip netns exec`, which the guest's busybox lacks).
func execIn(name string, argv []string) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	runtime.LockOSThread() // execve keeps the namespaces of the calling thread
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("netns %s: enter: %w", name, err)
	}
	return syscall.Exec(path, argv, os.Environ())
}

func serveCmd(args []string, stdout io.Writer) error {
	var c nettest.ServeConfig
	fs := newFlags("serve")
	fs.StringVar(&c.Netns, "netns", "", "namespace to serve in (default: the root namespace)")
	fs.StringVar(&c.Name, "name", "", "name to answer with")
	fs.IntVar(&c.Port, "port", 0, "TCP/UDP port")
	fs.BoolVar(&c.TCP, "tcp", false, "serve TCP")
	fs.BoolVar(&c.UDP, "udp", false, "serve UDP")
	drain := fs.Duration("drain", 0, "after SIGTERM, go on serving (old and new connections) this long before closing, as a pod that drains")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !c.TCP && !c.UDP {
		c.TCP, c.UDP = true, true
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	s, err := nettest.Serve(c)
	if err != nil {
		return err
	}
	var protos []string
	if c.TCP {
		protos = append(protos, "tcp")
	}
	if c.UDP {
		protos = append(protos, "udp")
	}
	ns := c.Netns
	if ns == "" {
		ns = "-"
	}
	fmt.Fprintf(stdout, "READY %s netns=%s port=%d %s\n", c.Name, ns, c.Port, strings.Join(protos, "+"))
	<-sigs
	if *drain > 0 {
		fmt.Fprintf(stdout, "DRAINING %s for %s\n", c.Name, *drain)
		select {
		case <-time.After(*drain):
		case <-sigs: // a second signal: now
		}
	}
	return s.Close()
}

func hitCmd(args []string, stdout io.Writer) error {
	var c nettest.HitConfig
	fs := newFlags("hit")
	fs.StringVar(&c.Netns, "netns", "", "namespace to connect from (default: the root namespace)")
	fs.StringVar(&c.Proto, "proto", "tcp", "tcp or udp")
	fs.StringVar(&c.Addr, "addr", "", "HOST:PORT to connect to")
	fs.IntVar(&c.N, "n", 1, "number of connections")
	fs.DurationVar(&c.Timeout, "timeout", nettest.DefaultHitTimeout, "timeout of one connection")
	fs.DurationVar(&c.Interval, "interval", 0, "pause between two connections")
	fs.IntVar(&c.SourcePort, "source-port", 0, "local port of every connection (0: any); TCP ones end with a reset")
	if err := parse(fs, args); err != nil {
		return err
	}
	if c.Timeout <= 0 {
		c.Timeout = nettest.DefaultHitTimeout
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	// Bound the whole run too: attempts are sequential.
	ctx, cancel2 := context.WithTimeout(ctx, time.Duration(c.N+1)*(c.Timeout+c.Interval+time.Second))
	defer cancel2()
	res, err := nettest.Hit(ctx, c)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

// downloadCmd times one download from a backend (nettest.Download) and
// prints its result as JSON.
func downloadCmd(args []string, stdout io.Writer) error {
	var c nettest.DownloadConfig
	fs := newFlags("download")
	fs.StringVar(&c.Netns, "netns", "", "namespace to connect from (default: the root namespace)")
	fs.StringVar(&c.Addr, "addr", "", "HOST:PORT of a vmagent serve backend")
	fs.Int64Var(&c.Size, "size", 8<<20, "bytes to download")
	fs.DurationVar(&c.Timeout, "timeout", 2*time.Minute, "timeout of the whole download")
	if err := parse(fs, args); err != nil {
		return err
	}
	res, err := nettest.Download(context.Background(), c)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

func holdCmd(args []string, stdout io.Writer) error {
	var c nettest.HoldConfig
	fs := newFlags("hold")
	fs.StringVar(&c.Netns, "netns", "", "namespace to connect from (default: the root namespace)")
	fs.StringVar(&c.Proto, "proto", "tcp", "tcp (one connection) or udp (one socket, one source port)")
	fs.StringVar(&c.Addr, "addr", "", "HOST:PORT to connect to")
	fs.DurationVar(&c.Interval, "interval", 200*time.Millisecond, "pause between questions")
	fs.DurationVar(&c.Timeout, "timeout", nettest.DefaultHitTimeout, "timeout of the connect and of each answer")
	fs.IntVar(&c.SourcePort, "source-port", 0, "local port of the flow (0: any); a TCP flow ends with a reset")
	fs.BoolVar(&c.Reset, "reset", false, "end a TCP connection with a reset when stopped, not a FIN")
	if err := parse(fs, args); err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	return nettest.Hold(ctx, c, stdout)
}
