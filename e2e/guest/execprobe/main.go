// Command execprobe counts execs whose output went missing, from wherever
// it runs (the bed runs it in the node's VM): through a kubelet's own exec
// endpoint, or straight through the container runtime's CRI streaming
// server (the URL of a CRI Exec call), which the kubelet otherwise
// proxies:
//
//	execprobe -url https://127.0.0.1:10250/exec/NS/POD/CONTAINER -n 20
//	execprobe -cri unix:///run/containerd/containerd.sock -container ID -n 20
//
// It prints an execcount.Result as JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/ipvs-proxy/ipvs-proxy/e2e/framework/execcount"
)

func main() {
	base := flag.String("url", "", "exec endpoint (a kubelet's /exec/NS/POD/CONTAINER)")
	cri := flag.String("cri", "", "CRI endpoint (unix:///PATH): exec through the runtime's streaming server")
	container := flag.String("container", "", "container ID, with -cri")
	n := flag.Int("n", 20, "execs")
	ws := flag.Bool("ws", false, "WebSocket executor instead of SPDY (with -url)")
	flag.Parse()
	exec := execcount.Kubelet(*base, *ws)
	if *cri != "" {
		conn, err := grpc.NewClient(*cri, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer conn.Close()
		rs := runtimeapi.NewRuntimeServiceClient(conn)
		exec = func(ctx context.Context, argv []string) (string, error) {
			resp, err := rs.Exec(ctx, &runtimeapi.ExecRequest{ContainerId: *container, Cmd: argv, Stdout: true, Stderr: true})
			if err != nil {
				return "", fmt.Errorf("CRI exec: %w", err)
			}
			u, err := url.Parse(resp.Url)
			if err != nil {
				return "", fmt.Errorf("CRI exec: %w", err)
			}
			return execcount.Stream(ctx, &rest.Config{Host: u.Scheme + "://" + u.Host}, u, false)
		}
	}
	res := execcount.Count(context.Background(), *n, exec)
	_ = json.NewEncoder(os.Stdout).Encode(res)
}
