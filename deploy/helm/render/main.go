// Command render prints ipvs-proxy's chart rendered with Helm's Go SDK, as
// `helm template` would: the bed's cluster installs it this way
// (e2e/framework/cluster, DeployIPVSProxyChart). With -alert-rules it
// prints the alert rules alone, as a Prometheus rule file (`make
// monitoring-check` gives it to promtool).
//
//	go run ./render -chart ipvs-proxy -namespace kube-system -f values.yaml
package main

import (
	"flag"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/ipvs-proxy/ipvs-proxy/deploy/helm"
)

func main() {
	chart := flag.String("chart", "ipvs-proxy", "the chart's folder")
	release := flag.String("release", "ipvs-proxy", "the release's name")
	namespace := flag.String("namespace", "kube-system", "the release's namespace")
	valuesFile := flag.String("f", "", "a values file (YAML) over the chart's values.yaml")
	rules := flag.Bool("alert-rules", false, "print the PrometheusRule's spec alone (prometheusRule.enabled set): a Prometheus rule file")
	flag.Parse()
	if err := run(*chart, *release, *namespace, *valuesFile, *rules); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(chart, release, namespace, valuesFile string, rules bool) error {
	vals := map[string]any{}
	if valuesFile != "" {
		b, err := os.ReadFile(valuesFile)
		if err != nil {
			return err
		}
		if err := yaml.Unmarshal(b, &vals); err != nil {
			return fmt.Errorf("values file %s: %w", valuesFile, err)
		}
	}
	if rules {
		b, err := helm.AlertRules(chart, release, namespace, vals)
		if err != nil {
			return err
		}
		_, err = os.Stdout.Write(b)
		return err
	}
	ms, err := helm.Render(chart, release, namespace, vals)
	if err != nil {
		return err
	}
	_, err = fmt.Print(helm.Stream(ms))
	return err
}
