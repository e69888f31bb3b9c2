// Package grafana holds ipvs-proxy's Grafana dashboard (ipvs-proxy.json,
// embedded) and reads the metrics its queries name, so that tests can hold
// them to the agent's registry (unit) and to a running agent (e2e).
package grafana

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/VictoriaMetrics/metricsql"
)

// Dashboard is ipvs-proxy.json, as Grafana imports it.
//
//go:embed ipvs-proxy.json
var Dashboard []byte

// Query is one PromQL expression of the dashboard: a panel's target, or a
// template variable's query.
type Query struct {
	Where string // panel title and refId, or "variable NAME"
	Expr  string
}

// Selector is one metric an expression selects, with the labels its
// matchers and groupings name.
type Selector struct {
	Metric string
	Labels []string
}

// panel is a dashboard's panel; a collapsed row holds its panels.
type panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// flat lists ps with each collapsed row's panels after it.
func flat(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flat(p.Panels)...)
	}
	return out
}

type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// Queries lists every expression of the dashboard b.
func Queries(b []byte) ([]Query, error) {
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Query
	for _, p := range flat(d.Panels) {
		for _, t := range p.Targets {
			if strings.TrimSpace(t.Expr) == "" {
				return nil, fmt.Errorf("dashboard: panel %q target %s has no expr", p.Title, t.RefID)
			}
			out = append(out, Query{Where: fmt.Sprintf("panel %q %s", p.Title, t.RefID), Expr: t.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			return nil, fmt.Errorf("dashboard: variable %s: %w", v.Name, err)
		}
		// label_values(SELECTOR, label): the selector is PromQL.
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			return nil, fmt.Errorf("dashboard: variable %s: %q is not label_values(selector, label)", v.Name, q.Query)
		}
		out = append(out, Query{Where: "variable " + v.Name, Expr: m[1]})
	}
	return out, nil
}

var (
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
	// Grafana's variables: $name, ${name}, ${name:format}.
	variable = regexp.MustCompile(`\$\{[^}]*\}|\$[a-zA-Z_][a-zA-Z0-9_]*`)
)

// Selectors parses expr (PromQL, with Grafana's variables) and returns the
// metrics it selects with the labels it names, in order of appearance.
func Selectors(expr string) ([]Selector, error) {
	// Interval variables become a duration, the others a regexp that
	// matches all (they only appear in label matchers).
	e := variable.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "__rate_interval") || strings.Contains(v, "__interval") || strings.Contains(v, "__range") {
			return "5m"
		}
		return ".*"
	})
	parsed, err := metricsql.Parse(e)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var out []Selector
	var grouping []string
	metricsql.VisitAll(parsed, func(x metricsql.Expr) {
		switch x := x.(type) {
		case *metricsql.MetricExpr:
			for _, group := range x.LabelFilterss {
				var s Selector
				for _, f := range group {
					if f.Label == "__name__" {
						s.Metric = f.Value
					} else {
						s.Labels = append(s.Labels, f.Label)
					}
				}
				out = append(out, s)
			}
		case *metricsql.AggrFuncExpr:
			grouping = append(grouping, x.Modifier.Args...)
		}
	})
	// A grouping label (sum by (kind)) is one of the selected metrics'.
	for i := range out {
		out[i].Labels = slices.Compact(slices.Sorted(slices.Values(append(out[i].Labels, grouping...))))
	}
	return out, nil
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// Check holds the dashboard's queries to series, the series names an agent
// exports with their label names: it returns the problems (a query that
// does not parse or selects nothing, a metric not in series, a label the
// metric lacks, Prometheus' job and instance excepted) and the metrics the
// queries name.
func Check(dashboard []byte, series map[string][]string) (problems, used []string) {
	qs, err := Queries(dashboard)
	if err != nil {
		return []string{err.Error()}, nil
	}
	seen := map[string]bool{}
	for _, q := range qs {
		sels, err := Selectors(q.Expr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", q.Where, err))
			continue
		}
		if len(sels) == 0 {
			problems = append(problems, fmt.Sprintf("%s: %q selects no metric", q.Where, q.Expr))
		}
		for _, s := range sels {
			labels, ok := series[s.Metric]
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: metric %q is not exported", q.Where, s.Metric))
				continue
			}
			seen[s.Metric] = true
			for _, l := range s.Labels {
				if !slices.Contains(labels, l) && !slices.Contains(targetLabels, l) {
					problems = append(problems, fmt.Sprintf("%s: %s has no label %q (it has %v)", q.Where, s.Metric, l, labels))
				}
			}
		}
	}
	for m := range seen {
		used = append(used, m)
	}
	slices.Sort(used)
	return problems, used
}

// Expand replaces Grafana's variables in expr ($name, ${name},
// ${name:format}) by their values in vars, as Grafana does before it
// sends a query; a variable vars lacks is an error.
func Expand(expr string, vars map[string]string) (string, error) {
	var missing []string
	out := variable.ReplaceAllStringFunc(expr, func(v string) string {
		name := strings.TrimPrefix(strings.TrimSuffix(strings.TrimPrefix(v, "${"), "}"), "$")
		name, _, _ = strings.Cut(name, ":")
		value, ok := vars[name]
		if !ok {
			missing = append(missing, v)
		}
		return value
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("dashboard: %q: no value for %v", expr, missing)
	}
	return out, nil
}

// Panel is a panel of the dashboard: the row it is under, its title, and
// the metrics (families: a histogram's _bucket, _sum and _count are one)
// its queries read, in order of appearance.
type Panel struct {
	Row, Title string
	Metrics    []string
}

// Panels lists the dashboard b's panels, rows left out.
func Panels(b []byte) ([]Panel, error) {
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Panel
	row := ""
	for _, p := range flat(d.Panels) {
		if p.Type == "row" {
			row = p.Title
			continue
		}
		pn := Panel{Row: row, Title: p.Title}
		for _, t := range p.Targets {
			sels, err := Selectors(t.Expr)
			if err != nil {
				return nil, fmt.Errorf("dashboard: panel %q %s: %w", p.Title, t.RefID, err)
			}
			for _, s := range sels {
				if m := family(s.Metric); !slices.Contains(pn.Metrics, m) {
					pn.Metrics = append(pn.Metrics, m)
				}
			}
		}
		out = append(out, pn)
	}
	return out, nil
}

// family is a series name's metric: a histogram's series are its own.
func family(series string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(series, suffix); ok {
			return f
		}
	}
	return series
}

// PanelTable is a Markdown table of ps: row, panel, metrics.
func PanelTable(ps []Panel) string {
	var b strings.Builder
	b.WriteString("| row | panel | metrics |\n|---|---|---|\n")
	for _, p := range ps {
		ms := make([]string, len(p.Metrics))
		for i, m := range p.Metrics {
			ms[i] = "`" + m + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", p.Row, p.Title, strings.Join(ms, ", "))
	}
	return b.String()
}
